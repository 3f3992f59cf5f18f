//! The promise, as an exact integer check: over every window `[t1, t2]` of
//! decision times, the tokens of kept admissions (admitted and never
//! refunded) are at most `capacity + (t2 - t1) / interval` (checked by
//! `tests/over_admission.rs` and `tests/exactness.rs`).

/// The worst excess over every window, in ns of refill time:
/// `max over t1 <= t2 of (kept tokens in [t1, t2] - capacity) * interval - (t2 - t1)`.
/// At most 0 when the promise holds; divide by `interval` for tokens.
/// `kept` holds `(now_ns, tokens)` of each kept admission, in any order.
pub fn worst_excess_ns(kept: &mut [(u64, u64)], capacity: u64, interval: u64) -> i128 {
    if kept.is_empty() {
        return -(capacity as i128 * interval as i128);
    }
    kept.sort_unstable();
    let t = interval as i128;
    // Window [t_i, t_j] over sorted admissions: tokens = S_j - S_{i-1}.
    // Excess = (S_j * T - t_j) + (t_i - S_{i-1} * T) - C * T; maximise the
    // second term over i <= j with a running maximum. Ties in time only make
    // a window that splits them smaller, so every i and j may be tried.
    let mut best = i128::MIN;
    let mut best_start = i128::MIN;
    let mut before: i128 = 0; // S_{i-1}
    for &(now, n) in kept.iter() {
        best_start = best_start.max(now as i128 - before * t);
        before += n as i128;
        best = best.max(before * t - now as i128 + best_start);
    }
    best - capacity as i128 * t
}

/// The same by brute force over every pair, to test the check itself.
pub fn worst_excess_ns_brute(kept: &[(u64, u64)], capacity: u64, interval: u64) -> i128 {
    let mut best = -(capacity as i128 * interval as i128);
    for &(a, _) in kept {
        for &(b, _) in kept {
            if a > b {
                continue;
            }
            let tokens: i128 = kept
                .iter()
                .filter(|&&(t, _)| a <= t && t <= b)
                .map(|&(_, n)| n as i128)
                .sum();
            best = best.max((tokens - capacity as i128) * interval as i128 - (b - a) as i128);
        }
    }
    best
}

/// The promise under quotas that differ from call to call: over every window
/// `[t1, t2]` of decision times, the kept admissions read in it cost at most
/// `(t2 - t1) +` the largest horizon among their quotas, each token costing
/// its own quota's interval. Returns the worst excess in ns (at most 0 when
/// the promise holds). `kept` holds `(now_ns, cost_ns, horizon_ns)` of each
/// kept admission (`cost = tokens x interval`, `horizon = capacity x
/// interval` of the quota it was decided with), in any order.
///
/// For each horizon `h` that occurs, the windows whose admissions all have a
/// horizon of at most `h` lie between the admissions with a larger one;
/// within such a run the largest `cost - span` is found in one pass (as in
/// [`worst_excess_ns`]), and `h` is subtracted. A window whose largest
/// horizon is `h` is counted exactly at `h`, and no window is counted above
/// its excess, so the maximum is exact: `O(horizons x n)` after sorting.
/// [`worst_excess_mixed_ns_brute`] checks it.
pub fn worst_excess_mixed_ns(kept: &[(u64, u64, u64)]) -> i128 {
    let mut sorted = kept.to_vec();
    sorted.sort_unstable();
    // Group admissions read at one instant: a window holds all or none.
    let mut groups: Vec<(i128, i128, u64)> = Vec::new(); // (time, cost, max horizon)
    for &(t, c, h) in &sorted {
        match groups.last_mut() {
            Some(g) if g.0 == t as i128 => {
                g.1 += c as i128;
                g.2 = g.2.max(h);
            }
            _ => groups.push((t as i128, c as i128, h)),
        }
    }
    let mut horizons: Vec<u64> = groups.iter().map(|g| g.2).collect();
    horizons.sort_unstable();
    horizons.dedup();
    let mut best = i128::MIN;
    for &h in &horizons {
        let mut best_start = i128::MIN;
        let mut before: i128 = 0;
        for &(t, c, gh) in &groups {
            if gh > h {
                // No window counted at `h` crosses this instant.
                best_start = i128::MIN;
                before = 0;
                continue;
            }
            best_start = best_start.max(t - before);
            before += c;
            best = best.max(before - t + best_start - h as i128);
        }
    }
    best
}

/// The same by brute force over every pair of readings, to test the check.
pub fn worst_excess_mixed_ns_brute(kept: &[(u64, u64, u64)]) -> i128 {
    let mut best = i128::MIN;
    for &(a, _, _) in kept {
        for &(b, _, _) in kept {
            if a > b {
                continue;
            }
            let inside = kept.iter().filter(|&&(t, _, _)| a <= t && t <= b);
            let cost: i128 = inside.clone().map(|&(_, c, _)| c as i128).sum();
            let horizon = inside.map(|&(_, _, h)| h).max().unwrap_or(0);
            best = best.max(cost - (b - a) as i128 - horizon as i128);
        }
    }
    best
}
