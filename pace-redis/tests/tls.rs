//! `rediss://` (feature `tls`): reserve and refund through TLS against a
//! `redis-server --tls-port` whose certificate a private CA signed; without
//! that CA the certificate is refused (no verification bypass).
#![cfg(feature = "tls")]

mod common;

use std::time::Duration;

use pace::Rate;
use pace_redis::{ConnectError, Error, OnUnavailable, RedisPace, Refunded, Source};

const S: u64 = 1_000_000_000;

fn builder() -> pace_redis::Builder {
    // 10 per second: interval 100 ms; capacity 3: tau 300 ms.
    RedisPace::builder(Rate::per_second(10).unwrap())
        .capacity(3)
        .timeout(Duration::from_secs(2))
        .deny_cache(false)
}

#[tokio::test]
async fn reserve_and_refund_through_tls_with_a_private_ca() {
    let server = common::RedisServer::start_tls();
    for host in ["localhost", "127.0.0.1"] {
        let p = builder()
            .tls_root_ca(server.tls().ca_pem.clone())
            .time_injection(true)
            .prefix(format!("tls-{host}:"))
            .connect(&server.tls_url(host))
            .await
            .unwrap_or_else(|e| panic!("rediss:// to {host}: {e}"));
        let t = 1_700_000_000 * S;
        let mut held = Vec::new();
        for i in 1..=3u64 {
            let r = p.reserve_n_at("k", 1, t).await.unwrap();
            assert_eq!(r.source(), Source::Server);
            assert_eq!(r.tat_ns(), t + i * 100_000_000);
            assert_eq!(
                r.prev_ns(),
                if i == 1 { 0 } else { t + (i - 1) * 100_000_000 }
            );
            held.push(r);
        }
        match p.reserve_n_at("k", 1, t).await {
            Err(Error::Denied(d)) => {
                assert_eq!(d.retry_after(), Duration::from_millis(100));
                assert_eq!(d.source(), Source::Server);
            }
            other => panic!("{other:?}"),
        }
        let last = held.pop().unwrap();
        assert_eq!(p.refund_at(last, t).await.unwrap(), Refunded::Restored);
        let again = p.reserve_n_at("k", 1, t).await.unwrap();
        assert_eq!(again.tat_ns(), t + 300_000_000);
        // The state written through TLS, read on the plain port.
        let stored: String = redis::cmd("GET")
            .arg(format!("tls-{host}:k"))
            .query(&mut server.admin())
            .unwrap();
        assert_eq!(stored, (t + 300_000_000).to_string());
    }
}

#[tokio::test]
async fn an_unknown_ca_is_refused() {
    let server = common::RedisServer::start_tls();
    let other = common::RedisServer::start_tls();
    // Under either policy: a refused certificate is not a server that is
    // down (LocalFallback does not start local-only).
    for policy in [
        OnUnavailable::FailClosed,
        OnUnavailable::LocalFallback { replicas: 2 },
    ] {
        // The system's roots do not hold the test CA: the handshake fails.
        match builder()
            .on_unavailable(policy)
            .connect(&server.tls_url("localhost"))
            .await
        {
            Err(e @ ConnectError::Tls(_)) => {
                assert!(e.to_string().contains("UnknownIssuer"), "{e}")
            }
            Err(e) => panic!("{policy:?}: expected a TLS failure, got {e}"),
            Ok(_) => panic!("connected to a server whose certificate no trusted CA signed"),
        }
        // Another private CA: refused as well.
        match builder()
            .on_unavailable(policy)
            .tls_root_ca(other.tls().ca_pem.clone())
            .connect(&server.tls_url("localhost"))
            .await
        {
            Err(ConnectError::Tls(_)) => {}
            Err(e) => panic!("{policy:?}: expected a TLS failure, got {e}"),
            Ok(_) => panic!("connected with the wrong CA"),
        }
    }
    // A plain connection to the TLS port gets no answer it understands.
    let plain = format!("redis://127.0.0.1:{}/", server.tls().port);
    assert!(builder()
        .timeout(Duration::from_millis(500))
        .connect(&plain)
        .await
        .is_err());
}
