//! Measures of an admitted stream.

/// The most events of `times` (sorted, ns) in any half-open window
/// `[t, t + window)`. Exact: the maximum is reached by a window starting at an
/// event, so one two-pointer pass over the events finds it.
pub fn worst_window(times: &[u64], window: u64) -> u64 {
    debug_assert!(times.windows(2).all(|p| p[0] <= p[1]), "times are sorted");
    let mut worst = 0;
    let mut end = 0;
    for (start, &t) in times.iter().enumerate() {
        let limit = t.saturating_add(window);
        while end < times.len() && times[end] < limit {
            end += 1;
        }
        worst = worst.max(end - start);
    }
    worst as u64
}

/// The number of events of `times` (sorted, ns) in the trailing window
/// `(x - window, x]` as a step function: `(x, count)` points, two at every
/// change (the value just before and just after), from `(0, 0)`.
pub fn trailing_series(times: &[u64], window: u64) -> Vec<(u64, u64)> {
    let mut points = vec![(0, 0)];
    let mut count = 0u64;
    let (mut next_in, mut next_out) = (0, 0);
    while next_out < times.len() {
        // An event at t counts from t on and stops counting at t + window.
        let enter = times.get(next_in).copied();
        let leave = times[next_out].saturating_add(window);
        let x = match enter {
            Some(t) if t < leave => t,
            _ => leave,
        };
        points.push((x, count));
        while next_in < times.len() && times[next_in] == x {
            count += 1;
            next_in += 1;
        }
        while next_out < times.len() && times[next_out].saturating_add(window) == x {
            count -= 1;
            next_out += 1;
        }
        points.push((x, count));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_window_is_half_open() {
        assert_eq!(worst_window(&[], 10), 0);
        assert_eq!(
            worst_window(&[0, 10], 10),
            1,
            "t and t+W never share a window"
        );
        assert_eq!(worst_window(&[0, 9], 10), 2);
        assert_eq!(worst_window(&[0, 5, 5, 14, 15, 24], 10), 3);
    }

    #[test]
    fn trailing_series_steps_up_and_down() {
        assert_eq!(trailing_series(&[], 10), vec![(0, 0)]);
        assert_eq!(
            trailing_series(&[2, 2, 5, 12], 10),
            vec![
                (0, 0),
                (2, 0),
                (2, 2),
                (5, 2),
                (5, 3),
                (12, 3),
                (12, 2), // 12 enters while both events at 2 leave
                (15, 2),
                (15, 1),
                (22, 1),
                (22, 0),
            ]
        );
    }
}
