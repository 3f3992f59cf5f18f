//! An outage as a caller sees it: every fail-closed answer comes with the
//! wait until the limiter tries Redis again (`unavailable_for`: the rest of
//! the circuit's backoff), and the log says it once per outage (a warning
//! at its start, an info line at its end), not once per call.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pace::Rate;
use pace_redis::{BackendError, Error, RedisPace, Source};

/// The `pace_redis` log lines of this test binary.
static LINES: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.target() == "pace_redis"
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.target() == "pace_redis" {
            LINES
                .lock()
                .unwrap()
                .push((r.level(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

fn take() -> Vec<(log::Level, String)> {
    std::mem::take(&mut *LINES.lock().unwrap())
}

const BACKOFF: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_says_when_to_retry_and_an_outage_is_logged_once() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let mut server = common::RedisServer::start();
    let p = RedisPace::builder(Rate::per_second(1000).unwrap())
        .timeout(Duration::from_millis(300))
        .backoff(BACKOFF)
        .deny_cache(false)
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(p.reserve("k").await.unwrap().source(), Source::Server);
    assert_eq!(p.unavailable_for("k"), Duration::ZERO);
    take();

    for outage in 0..2 {
        server.stop();
        // 1.2 s of calls: three backoffs, each opened by a failed call.
        let start = Instant::now();
        let (mut tries, mut open, mut zero) = (0, 0, 0);
        while start.elapsed() < BACKOFF * 3 {
            match p.reserve("k").await {
                Err(Error::Unavailable(BackendError::CircuitOpen)) => open += 1,
                Err(Error::Unavailable(_)) => tries += 1,
                other => panic!("{other:?}"),
            }
            // Every refusal states a wait: the rest of the backoff the
            // failed call (this one or an earlier one) opened; zero only
            // when the backoff ended between the answer and the question
            // (at most once per backoff).
            let wait = p.unavailable_for("k");
            assert!(
                wait <= BACKOFF,
                "outage {outage}: a refusal with a wait of {wait:?}"
            );
            if wait.is_zero() {
                zero += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // One try per backoff at most, every other call answered by the
        // open circuit: counted against the span measured (1.2 s, more on
        // a loaded machine, which only loosens the bound), not against the
        // number of calls a loaded machine manages.
        let span = start.elapsed();
        let backoffs = (span.as_nanos() / BACKOFF.as_nanos()) as u64 + 1;
        assert!(
            (2..=backoffs).contains(&tries),
            "{tries} tries in {span:?} ({backoffs} backoffs)"
        );
        // A refusal without a wait only when a backoff ended between the
        // answer and the question: once per backoff ended in the span.
        assert!(
            zero < backoffs,
            "{zero} refusals without a wait in {span:?}"
        );
        let lines = take();
        let warnings: Vec<_> = lines
            .iter()
            .filter(|(l, _)| *l == log::Level::Warn)
            .collect();
        assert_eq!(
            warnings.len(),
            1,
            "outage {outage}: {} calls, one warning per outage: {lines:?}",
            tries + open
        );
        assert!(warnings[0].1.contains("gives no decision"), "{lines:?}");
        assert!(warnings[0].1.contains("FailClosed"), "{lines:?}");
        assert_eq!(p.stats().outages, outage + 1);

        server.restart();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match p.reserve("k").await {
                Ok(r) => {
                    assert_eq!(r.source(), Source::Server);
                    break;
                }
                Err(Error::Unavailable(_)) => {}
                Err(e) => panic!("{e}"),
            }
            assert!(Instant::now() < deadline, "never answered again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(p.unavailable_for("k"), Duration::ZERO);
        for _ in 0..10 {
            assert_eq!(p.reserve("k").await.unwrap().source(), Source::Server);
        }
        let lines = take();
        assert_eq!(
            lines
                .iter()
                .filter(|(l, m)| *l == log::Level::Info && m.contains("answers again"))
                .count(),
            1,
            "{lines:?}"
        );
        assert!(
            lines.iter().all(|(l, _)| *l != log::Level::Warn),
            "{lines:?}"
        );
    }
}
