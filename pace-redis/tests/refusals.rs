//! A server that answers and refuses the client is not a server that is
//! down: under `LocalFallback` as under `FailClosed`, a refused login
//! (`requirepass` without a password, or a wrong one) fails `connect` with
//! `ConnectError::Auth`, and a URL that does not parse with
//! `ConnectError::InvalidUrl` (TLS refusals: tests/tls.rs). A server that
//! cannot be reached still starts a `LocalFallback` limiter.

mod common;

use std::time::Duration;

use pace::Rate;
use pace_redis::{ConnectError, OnUnavailable, RedisPace, Source};

const POLICIES: [OnUnavailable; 2] = [
    OnUnavailable::FailClosed,
    OnUnavailable::LocalFallback { replicas: 2 },
];

fn builder(policy: OnUnavailable) -> pace_redis::Builder {
    RedisPace::builder(Rate::per_second(10).unwrap())
        .timeout(Duration::from_secs(2))
        .on_unavailable(policy)
}

#[tokio::test]
async fn a_refused_login_fails_connect_under_either_policy() {
    let server = common::RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query(&mut server.admin())
        .unwrap();
    let port = server.port;
    for policy in POLICIES {
        for check in [
            pace_redis::EvictionCheck::Warn,
            pace_redis::EvictionCheck::Ignore,
        ] {
            // No password: the server accepts the connection, then answers
            // NOAUTH.
            match builder(policy)
                .eviction_check(check)
                .connect(&format!("redis://127.0.0.1:{port}/"))
                .await
            {
                Err(ConnectError::Auth(e)) => {
                    assert!(e.to_string().contains("NOAUTH"), "{e}")
                }
                Err(e) => panic!("{policy:?} {check:?}, no password: {e}"),
                Ok(_) => panic!("{policy:?} {check:?}: connected without the password"),
            }
            // A wrong password.
            match builder(policy)
                .eviction_check(check)
                .connect(&format!("redis://:wrong@127.0.0.1:{port}/"))
                .await
            {
                Err(e @ ConnectError::Auth(_)) => {
                    assert!(e.to_string().starts_with("redis refused the login"), "{e}")
                }
                Err(e) => panic!("{policy:?} {check:?}, wrong password: {e}"),
                Ok(_) => panic!("{policy:?} {check:?}: connected with a wrong password"),
            }
        }
        // The right one: decisions on the server.
        let p = builder(policy)
            .connect(&format!("redis://:s3cret@127.0.0.1:{port}/"))
            .await
            .unwrap();
        assert_eq!(p.reserve("k").await.unwrap().source(), Source::Server);
    }
}

#[tokio::test]
async fn a_url_that_does_not_parse_says_so() {
    for policy in POLICIES {
        for url in [
            "not a url",
            "http://127.0.0.1:6379/",
            "redis://127.0.0.1:notaport/",
        ] {
            match builder(policy).connect(url).await {
                Err(e @ ConnectError::InvalidUrl(_)) => {
                    assert!(e.to_string().contains("does not parse"), "{e}")
                }
                Err(e) => panic!("{url}: {e}"),
                Ok(_) => panic!("{url}: connected"),
            }
        }
    }
}

#[tokio::test]
async fn an_unreachable_server_is_not_a_refusal() {
    let mut server = common::RedisServer::start();
    let url = server.url();
    server.stop();
    match builder(OnUnavailable::FailClosed)
        .timeout(Duration::from_millis(300))
        .connect(&url)
        .await
    {
        Err(e @ ConnectError::Redis(_)) => {
            assert!(e.to_string().starts_with("cannot reach redis"), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("connected to a dead port"),
    }
    let p = builder(OnUnavailable::LocalFallback { replicas: 2 })
        .timeout(Duration::from_millis(300))
        .connect(&url)
        .await
        .unwrap();
    assert_eq!(p.reserve("k").await.unwrap().source(), Source::Local);
}
