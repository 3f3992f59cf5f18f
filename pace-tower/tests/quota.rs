//! Quotas chosen per request (`Limit::quota`), live changes of the default
//! quota (`Pace::set_quota`), and queueing (`Limit::wait_up_to`), through
//! `tower::ServiceExt::oneshot` and `Service::call`.

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::{HeaderValue, Request, Response, StatusCode};
use pace::{ManualClock, Pace, Quota, Rate};
use pace_tower::{from_fn, Limit, PaceLayer, Reason, Rejection, RequestHead};
use tower::{Layer, Service, ServiceExt};

type P = Pace<String, RandomState, ManualClock>;

fn req(key: &str, plan: Option<&str>) -> Request<()> {
    let mut b = Request::builder().uri("/").header("x-key", key);
    if let Some(p) = plan {
        b = b.header("x-plan", p);
    }
    b.body(()).unwrap()
}

fn header<'a>(r: &'a Response<String>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

fn ok() -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + Send {
    tower::service_fn(|_: Request<()>| ready(Ok::<_, Infallible>(Response::new(String::new()))))
}

fn key(h: &RequestHead<'_>) -> Option<String> {
    Some(h.headers.get("x-key")?.to_str().ok()?.to_string())
}

/// The paid plan: 5 tokens at 5/s (refilled in 1 s).
fn paid() -> Quota {
    Quota::per_second(5).unwrap()
}

/// The limiter's default (the free plan): 2 tokens at 1/s (refilled in 2 s).
fn free_pace(clock: &ManualClock) -> Arc<P> {
    Arc::new(
        Pace::builder(Rate::per_second(1).unwrap())
            .capacity(2)
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

fn clock() -> ManualClock {
    let c = ManualClock::new();
    c.set(Duration::from_secs(100));
    c
}

/// Admitted requests of `key` under `plan` until the first 429 (at most
/// 20), and the responses.
async fn drain<S>(svc: &S, key: &str, plan: Option<&str>) -> (u64, Vec<Response<String>>)
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible> + Clone,
{
    let mut seen = Vec::new();
    for n in 0..20 {
        let r = svc.clone().oneshot(req(key, plan)).await.unwrap();
        let status = r.status();
        seen.push(r);
        if status == StatusCode::TOO_MANY_REQUESTS {
            return (n, seen);
        }
        assert_eq!(status, StatusCode::OK);
    }
    panic!("no 429 in 20 requests");
}

#[tokio::test]
async fn each_plan_gets_its_own_budget_and_policy_on_one_limit() {
    let c = clock();
    let limiter = free_pace(&c);
    let layer = PaceLayer::builder()
        .limit(
            Limit::new("per-key", limiter.clone(), from_fn(key))
                .quota(|h| (h.headers.get("x-plan")? == "paid").then(paid)),
        )
        .build()
        .unwrap();
    let svc = layer.layer(ok());

    // The free plan: the limiter's default, 2 tokens.
    let (n, seen) = drain(&svc, "alice", None).await;
    assert_eq!(n, 2);
    assert_eq!(
        header(&seen[0], "ratelimit-policy"),
        Some("\"per-key\";q=2;w=2")
    );
    assert_eq!(header(&seen[0], "ratelimit"), Some("\"per-key\";r=1;t=1"));
    assert_eq!(
        header(&seen[2], "ratelimit-policy"),
        Some("\"per-key\";q=2;w=2")
    );
    assert_eq!(header(&seen[2], "retry-after"), Some("1"));

    // The paid plan on the same limiter: 5 tokens, its own policy.
    let (n, seen) = drain(&svc, "bob", Some("paid")).await;
    assert_eq!(n, 5);
    assert_eq!(
        header(&seen[0], "ratelimit-policy"),
        Some("\"per-key\";q=5;w=1")
    );
    assert_eq!(header(&seen[0], "ratelimit"), Some("\"per-key\";r=4;t=1"));
    assert_eq!(header(&seen[3], "ratelimit"), Some("\"per-key\";r=1;t=1"));
    assert_eq!(
        header(&seen[5], "ratelimit-policy"),
        Some("\"per-key\";q=5;w=1")
    );
    assert_eq!(header(&seen[5], "retry-after"), Some("1"));

    // One key, its plan changed: once its bucket is full again, it gets the
    // new plan's budget; the debt of the old plan counts under the new one.
    c.advance(Duration::from_secs(2));
    let (n, _) = drain(&svc, "alice", Some("paid")).await;
    assert_eq!(n, 5);
    c.advance(Duration::from_secs(1));
    let (n, _) = drain(&svc, "bob", None).await;
    assert_eq!(n, 2);
    // Bob's 2 free tokens are a debt of 2 s: under the paid plan (a horizon
    // of 1 s) nothing is left for a second.
    let (n, seen) = drain(&svc, "bob", Some("paid")).await;
    assert_eq!(n, 0);
    // Its turn under the paid plan: when the debt is 1 s less 0.2 s.
    assert_eq!(header(&seen[0], "retry-after"), Some("2"));
    assert_eq!(header(&seen[0], "ratelimit"), Some("\"per-key\";r=0;t=2"));
    // 1.4 s later the debt is 0.6 s: 2 paid tokens of 0.2 s fit a horizon
    // of 1 s.
    c.advance(Duration::from_millis(1400));
    let (n, _) = drain(&svc, "bob", Some("paid")).await;
    assert_eq!(n, 2);
}

#[tokio::test]
async fn a_live_default_quota_change_changes_the_next_answers() {
    let c = clock();
    let limiter = free_pace(&c);
    let layer = PaceLayer::builder()
        .limit(Limit::new("per-key", limiter.clone(), from_fn(key)))
        .build()
        .unwrap();
    let svc = layer.layer(ok());

    let (n, seen) = drain(&svc, "k", None).await;
    assert_eq!(n, 2);
    assert_eq!(
        header(&seen[0], "ratelimit-policy"),
        Some("\"per-key\";q=2;w=2")
    );

    // Capacity 4 at the same rate: the debt of 2 s leaves 2 tokens of 4.
    limiter.set_quota(Quota::new(Rate::per_second(1).unwrap(), 4).unwrap());
    let (n, seen) = drain(&svc, "k", None).await;
    assert_eq!(n, 2);
    assert_eq!(
        header(&seen[0], "ratelimit-policy"),
        Some("\"per-key\";q=4;w=4")
    );
    assert_eq!(header(&seen[0], "ratelimit"), Some("\"per-key\";r=1;t=3"));
    assert_eq!(
        header(&seen[2], "ratelimit-policy"),
        Some("\"per-key\";q=4;w=4")
    );
    // A fresh key gets the new capacity whole.
    let (n, _) = drain(&svc, "fresh", None).await;
    assert_eq!(n, 4);

    // Back to the build-time quota: the build-time policy again.
    limiter.set_quota(Quota::new(Rate::per_second(1).unwrap(), 2).unwrap());
    c.advance(Duration::from_secs(10));
    let (n, seen) = drain(&svc, "k", None).await;
    assert_eq!(n, 2);
    assert_eq!(
        header(&seen[0], "ratelimit-policy"),
        Some("\"per-key\";q=2;w=2")
    );
}

/// A queueing layer on a 1-token bucket at 20/s (a turn every 50 ms):
/// records the order the inner service sees requests in, and puts the
/// exact wait of a 429 in `x-retry-after-ms`.
fn queueing(
    max: Duration,
    order: Arc<Mutex<Vec<(usize, Instant)>>>,
) -> (
    Arc<Pace<String>>,
    impl Service<
            Request<()>,
            Response = Response<String>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone,
) {
    let limiter: Arc<Pace<String>> = Arc::new(
        Pace::builder(Rate::per_second(20).unwrap())
            .capacity(1)
            .build()
            .unwrap(),
    );
    let inner = tower::service_fn(move |r: Request<()>| {
        let i: usize = r.headers()["x-i"].to_str().unwrap().parse().unwrap();
        order.lock().unwrap().push((i, Instant::now()));
        ready(Ok::<_, Infallible>(Response::new(String::new())))
    });
    let layer = PaceLayer::builder()
        .limit(Limit::new("per-key", limiter.clone(), from_fn(key)).wait_up_to(max))
        .on_reject(|r: &Rejection<'_>, default: Response<()>| {
            let (mut head, ()) = default.into_parts();
            if let Reason::Exhausted { retry_after } = r.reason {
                head.headers.insert(
                    "x-retry-after-us",
                    HeaderValue::from(retry_after.as_micros() as u64),
                );
            }
            Response::from_parts(head, String::new())
        })
        .build()
        .unwrap();
    (limiter, layer.layer(inner))
}

fn numbered(key: &str, i: usize) -> Request<()> {
    Request::builder()
        .uri("/")
        .header("x-key", key)
        .header("x-i", i)
        .body(())
        .unwrap()
}

/// Polls `fut` once: its output if it is ready at once.
fn now<F: Future>(fut: &mut std::pin::Pin<&mut F>) -> Option<F::Output> {
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_go_through_in_arrival_order_and_the_rest_get_429_at_once() {
    let order = Arc::new(Mutex::new(Vec::new()));
    // Turns at 0, 50, 100, 150, 200 and 250 ms: 6 fit a bound of 280 ms.
    let (_, svc) = queueing(Duration::from_millis(280), order.clone());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let mut s = svc.clone();
        // Each request reserves its turn in `call`, in this order.
        let fut = s.call(numbered("k", i));
        tasks.push(tokio::spawn(
            async move { (fut.await.unwrap(), Instant::now()) },
        ));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let (r, done) = t.await.unwrap();
        statuses.push(r.status());
        // Its turn was within the bound: the 200 says so (a turn beyond it
        // is a 429 at once). The wall clock is no proof (a loaded machine
        // stretches it); 10 s is a bound only a hang exceeds.
        assert!(
            done - start < Duration::from_secs(10),
            "a queued request hung: {:?}",
            done - start
        );
    }
    assert_eq!(statuses, vec![StatusCode::OK; 6]);
    let order = order.lock().unwrap();
    let seen: Vec<usize> = order.iter().map(|&(i, _)| i).collect();
    assert_eq!(seen, (0..6).collect::<Vec<_>>(), "arrival order");
    for (i, &(_, at)) in order.iter().enumerate() {
        // Never before its turn (50 ms apart from the first reservation,
        // which is after `start`; 1 ms for the limiter's clock against
        // `Instant`).
        assert!(
            at - start + Duration::from_millis(1) >= Duration::from_millis(50 * i as u64),
            "request {i} let through {:?} after the start",
            at - start
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_bound_a_request_gets_429_at_once_with_the_exact_wait() {
    let order = Arc::new(Mutex::new(Vec::new()));
    // Turns at 0, 50 and 100 ms fit a bound of 120 ms; the next would be
    // at 150 ms.
    let (_, svc) = queueing(Duration::from_millis(120), order.clone());
    let mut s = svc.clone();
    let start = Instant::now();
    let mut admitted = Vec::new();
    for i in 0..3 {
        admitted.push(tokio::spawn(s.call(numbered("k", i))));
    }
    for i in 3..6 {
        let mut fut = pin!(s.call(numbered("k", i)));
        let r = now(&mut fut)
            .expect("a request beyond the bound is answered at once")
            .unwrap();
        let elapsed = start.elapsed();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&r, "retry-after"), Some("1"));
        let wait = Duration::from_micros(header(&r, "x-retry-after-us").unwrap().parse().unwrap());
        // The turn it would need: 150 ms after the first reservation.
        assert!(wait <= Duration::from_millis(150), "{wait:?}");
        assert!(
            wait + elapsed + Duration::from_millis(1) >= Duration::from_millis(150),
            "{wait:?} + {elapsed:?}"
        );
    }
    for t in admitted {
        assert_eq!(t.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let seen: Vec<usize> = order.lock().unwrap().iter().map(|&(i, _)| i).collect();
    assert_eq!(seen, vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_before_its_turn_gives_the_turn_back() {
    let order = Arc::new(Mutex::new(Vec::new()));
    // Turns at 0, 50 and 100 ms fit 120 ms; a fourth (150 ms) does not.
    let (_, svc) = queueing(Duration::from_millis(120), order.clone());
    let mut s = svc.clone();
    let first = tokio::spawn(s.call(numbered("k", 0)));
    let second = tokio::spawn(s.call(numbered("k", 1)));
    let third = s.call(numbered("k", 2));
    // The last turn, dropped before it comes: nothing was debited since, so
    // its token returns and the next request takes the same turn.
    drop(third);
    let fourth = tokio::spawn(s.call(numbered("k", 3)));
    let mut fut = pin!(s.call(numbered("k", 4)));
    let r = now(&mut fut).expect("beyond the bound").unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    for t in [first, second, fourth] {
        assert_eq!(t.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let seen: Vec<usize> = order.lock().unwrap().iter().map(|&(i, _)| i).collect();
    assert_eq!(seen, vec![0, 1, 3]);
}

#[tokio::test]
async fn a_queued_request_that_can_never_pass_is_denied_for_good_at_once() {
    let calls = Arc::new(Mutex::new(0));
    let inner_calls = calls.clone();
    let limiter: Arc<Pace<String>> = Arc::new(
        Pace::builder(Rate::per_second(20).unwrap())
            .capacity(1)
            .build()
            .unwrap(),
    );
    let layer = PaceLayer::builder()
        .limit(
            Limit::new("per-key", limiter.clone(), from_fn(key))
                .cost(|h| {
                    if h.headers.contains_key("x-big") {
                        2
                    } else {
                        1
                    }
                })
                .wait_up_to(Duration::from_secs(10)),
        )
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(move |_: Request<()>| {
        *inner_calls.lock().unwrap() += 1;
        ready(Ok::<_, Infallible>(Response::new(String::new())))
    }));
    let big = Request::builder()
        .uri("/")
        .header("x-key", "k")
        .header("x-big", "1")
        .body(())
        .unwrap();
    let mut fut = pin!(svc.call(big));
    let r = now(&mut fut).expect("answered at once").unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&r, "retry-after"), None);
    // Nothing was written: the key's one token is still there.
    assert_eq!(limiter.peek("k"), 1);
    assert_eq!(*calls.lock().unwrap(), 0);
}

/// A limit skipped for a request (no key, `MissingKey::Skip`) still has its
/// item in `RateLimit-Policy`, under the quota it has now.
#[tokio::test]
async fn a_skipped_limit_s_policy_follows_a_live_quota_change() {
    let c = clock();
    let first = free_pace(&c);
    let second = free_pace(&c);
    let svc = PaceLayer::builder()
        .limit(Limit::new("first", first, from_fn(key)))
        .limit(
            Limit::new(
                "second",
                second.clone(),
                from_fn(|h: &RequestHead<'_>| {
                    Some(h.headers.get("x-second")?.to_str().ok()?.to_string())
                }),
            )
            .missing_key(pace_tower::MissingKey::Skip),
        )
        .build()
        .unwrap()
        .layer(ok());
    let r = svc.clone().oneshot(req("a", None)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "ratelimit"), Some("\"first\";r=1;t=1"));
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"first\";q=2;w=2, \"second\";q=2;w=2")
    );
    second.set_quota(Quota::new(Rate::per_second(1).unwrap(), 4).unwrap());
    let r = svc.clone().oneshot(req("b", None)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"first\";q=2;w=2, \"second\";q=4;w=4")
    );
}
