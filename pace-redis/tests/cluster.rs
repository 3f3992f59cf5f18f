//! A real 3-primary Redis Cluster on loopback (feature `cluster`): 300 keys
//! all answered, each on its slot's primary, singly and through
//! `reserve_many` (one pipeline per slot); a single-node client against the
//! same cluster gets MOVED for the keys of the other primaries.
#![cfg(feature = "cluster")]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use pace::Rate;
use pace_redis::{BackendError, Error, RedisPace, Source};

const INTERVAL_NS: u64 = 3_600_000_000_000;

fn builder(prefix: &str) -> pace_redis::Builder {
    // One token per hour, capacity 2: nothing refills during the test.
    RedisPace::builder(Rate::new(1, Duration::from_secs(3600)).unwrap())
        .capacity(2)
        .timeout(Duration::from_secs(2))
        .deny_cache(false)
        .prefix(prefix)
}

/// Which node holds `redis_key`, by asking each node for it (a node
/// without the key's slot answers MOVED).
fn holder(admins: &mut [redis::Connection], redis_key: &str) -> Vec<(usize, u64)> {
    let mut found = Vec::new();
    for (i, conn) in admins.iter_mut().enumerate() {
        let v: redis::RedisResult<Option<u64>> = redis::cmd("GET").arg(redis_key).query(conn);
        if let Ok(Some(v)) = v {
            found.push((i, v));
        }
    }
    found
}

/// The cluster's 3 primaries (their indices in `nodes`) and a connection
/// to each.
fn primaries(cluster: &common::Cluster) -> (Vec<usize>, Vec<redis::Connection>) {
    let primaries: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| {
            cluster.nodes[i]
                .info_field("replication", "role")
                .as_deref()
                == Some("master")
        })
        .collect();
    assert_eq!(primaries.len(), 3);
    let admins = primaries
        .iter()
        .map(|&i| cluster.nodes[i].admin())
        .collect();
    (primaries, admins)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_keys_on_a_three_primary_cluster() {
    let cluster = common::Cluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();

    // Before: one node's address, no cluster client: MOVED for the keys of
    // the other two primaries.
    // Which keys: those whose slot the first node does not serve, by its
    // own `CLUSTER NODES` line (`myself`, then its slot ranges).
    let owned: Vec<(u16, u16)> = {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut cluster.nodes[0].admin())
            .unwrap();
        let line = text
            .lines()
            .find(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
            .unwrap();
        line.split(' ')
            .skip(8)
            .map(|r| match r.split_once('-') {
                Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                None => (r.parse().unwrap(), r.parse().unwrap()),
            })
            .collect()
    };
    let single = builder("one:").connect(nodes[0]).await.unwrap();
    let mut moved = 0;
    let mut served = 0;
    for i in 0..300 {
        let key = format!("key-{i}");
        let slot = single.slot(&key);
        let here = owned.iter().any(|&(a, b)| (a..=b).contains(&slot));
        match single.reserve(&key).await {
            Ok(r) => {
                assert_eq!(r.source(), Source::Server);
                assert!(
                    here,
                    "{key} (slot {slot}) served by a node without its slot"
                );
                served += 1;
            }
            Err(Error::Unavailable(BackendError::Redis(e))) => {
                assert_eq!(e.kind(), redis::ErrorKind::Moved, "{e}");
                assert!(!here, "{key} (slot {slot}) moved away from its own node");
                moved += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // Every key answered by its slot alone (above): the counts follow from
    // the key names and the first node's slots, never from the run.
    assert_eq!(moved + served, 300);
    assert!(moved > 100 && served > 50, "moved {moved}, served {served}");

    let p = builder("c:").connect_cluster(&nodes).await.unwrap();
    assert_eq!(p.maxmemory_policy().as_deref(), Some("noeviction"));
    // The client's slots are the server's.
    let mut admins: Vec<redis::Connection> = cluster.nodes.iter().map(|n| n.admin()).collect();
    let mut admin = cluster.nodes[0].admin();
    for i in 0..300 {
        let key = format!("key-{i}");
        let server_slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(p.redis_key(&key))
            .query(&mut admin)
            .unwrap();
        assert_eq!(p.slot(&key), server_slot, "{key}");
    }
    for tagged in ["{user-1}:login", "a{user-1}b", "{}x", "x{}{y}", "{{a}}"] {
        let server_slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(p.redis_key(tagged))
            .query(&mut admin)
            .unwrap();
        assert_eq!(p.slot(tagged), server_slot, "{tagged}");
    }

    // Single calls: every key drains exactly its capacity.
    let mut per_node = [0usize; 3];
    for i in 0..300 {
        let key = format!("key-{i}");
        let a = p.reserve(&key).await.unwrap();
        let b = p.reserve(&key).await.unwrap();
        assert_eq!((a.source(), a.prev_ns()), (Source::Server, 0));
        assert_eq!(a.tat_ns(), a.server_now_ns().unwrap() + INTERVAL_NS);
        assert_eq!(b.prev_ns(), a.tat_ns());
        assert_eq!(b.tat_ns(), a.tat_ns() + INTERVAL_NS);
        match p.reserve(&key).await {
            Err(Error::Denied(d)) => assert_eq!(d.source(), Source::Server),
            other => panic!("{key}: {other:?}"),
        }
        let at = holder(&mut admins, &p.redis_key(&key));
        assert_eq!(at.len(), 1, "{key} on {at:?}");
        assert_eq!(at[0].1, b.tat_ns());
        per_node[at[0].0] += 1;
    }
    assert!(per_node.iter().all(|&n| n > 50), "{per_node:?}");

    // reserve_many: 300 keys (some twice) in one call, grouped by slot.
    let keys: Vec<String> = (0..300).map(|i| format!("many-{i}")).collect();
    let mut requests: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    requests.extend(keys.iter().take(20).map(|k| (k.as_str(), 1)));
    requests.push((keys[0].as_str(), 1));
    let trips_before = p.stats().round_trips;
    let answers = p.reserve_many(&requests).await;
    assert_eq!(answers.len(), 321);
    let mut admitted: HashMap<&str, u64> = HashMap::new();
    for ((key, _), a) in requests.iter().zip(&answers) {
        match a {
            Ok(r) => {
                assert_eq!(r.source(), Source::Server);
                *admitted.entry(key).or_default() += 1;
            }
            Err(Error::Denied(d)) => {
                assert_eq!(*key, keys[0].as_str(), "only key 0 was asked 3 times");
                assert_eq!(d.source(), Source::Server);
            }
            Err(e) => panic!("{key}: {e}"),
        }
    }
    for (i, k) in keys.iter().enumerate() {
        let expect = if i < 20 { 2 } else { 1 };
        assert_eq!(admitted[k.as_str()], expect, "{k}");
        let at = holder(&mut admins, &p.redis_key(k));
        assert_eq!(at.len(), 1, "{k} on {at:?}");
    }
    let slots: std::collections::HashSet<u16> = keys.iter().map(|k| p.slot(k)).collect();
    assert_eq!(p.stats().round_trips - trips_before, slots.len() as u64);

    // Holds keep their state in the key itself: one key, one slot, on every
    // primary; refunds out of order are exact there.
    for i in 0..30 {
        let key = format!("hold-{i}");
        let a = p.hold(&key).await.unwrap();
        let b = p.hold(&key).await.unwrap();
        assert!(matches!(p.hold(&key).await, Err(Error::Denied(_))));
        assert_eq!(a.refund().await.unwrap(), pace_redis::Refunded::Restored);
        assert_eq!(b.refund().await.unwrap(), pace_redis::Refunded::Restored);
        let c = p.hold(&key).await.unwrap();
        assert!(c.keep().await.unwrap());
        assert_eq!(p.peek(&key).await.unwrap().remaining(), 1);
    }
}

/// One primary of a 3-primary cluster (a replica each, node timeout 1 s)
/// dies while keys on every primary are called: its keys get no decision
/// until its replica takes over, and the keys of the two healthy primaries
/// keep being decided by the server: a circuit per node, so a healthy
/// node's circuit opens only after a failure of its own (a call of one of
/// its keys that timed out, which a loaded machine may cause). No check
/// counts on speed: the window only bounds how long the calls go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_primary_down_leaves_the_others_deciding() {
    let mut cluster = common::Cluster::start_with(1, &["--cluster-node-timeout", "1000"]);
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    // One token per 10 s, 100,000 of them: every call admitted, every key
    // kept for the holder check.
    let p = RedisPace::builder(Rate::new(1, Duration::from_secs(10)).unwrap())
        .capacity(100_000)
        .timeout(Duration::from_millis(200))
        .backoff(Duration::from_millis(100))
        .deny_cache(false)
        .prefix("o:")
        .connect_cluster(&nodes)
        .await
        .unwrap();
    // Where each key lives: the primary that holds it after a first call.
    let (primaries, mut admins) = primaries(&cluster);
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    let mut on = Vec::new();
    for k in &keys {
        assert_eq!(p.reserve(k).await.unwrap().source(), Source::Server);
        let at = holder(&mut admins, &p.redis_key(k));
        assert_eq!(at.len(), 1, "{k}: {at:?}");
        on.push(at[0].0);
    }
    let victim = 0;
    let dead: Vec<String> = (0..keys.len())
        .filter(|&i| on[i] == victim)
        .map(|i| keys[i].clone())
        .collect();
    let healthy: Vec<(String, usize)> = (0..keys.len())
        .filter(|&i| on[i] != victim)
        .map(|i| (keys[i].clone(), on[i]))
        .collect();
    assert!(dead.len() > 5 && healthy.len() > 20, "{on:?}");

    cluster.nodes[primaries[victim]].stop();
    let window = Duration::from_secs(3);
    let start = std::time::Instant::now();
    // The dead primary's keys, called all along (their failures open the
    // circuit they fall under).
    let pd = p.clone();
    let dead_calls = tokio::spawn(async move {
        let (mut served, mut failed) = (0u64, 0u64);
        while start.elapsed() < window {
            for k in &dead {
                match pd.reserve(k).await {
                    Ok(_) => served += 1,
                    Err(Error::Unavailable(_)) => failed += 1,
                    Err(e) => panic!("{k}: {e}"),
                }
            }
        }
        (served, failed)
    });
    let (mut server, mut other) = (0u64, 0u64);
    let mut errors = std::collections::BTreeMap::new();
    // The healthy primaries whose keys had a call time out so far.
    let mut timed_out = std::collections::HashSet::new();
    while start.elapsed() < window {
        for (k, node) in &healthy {
            match p.reserve(k).await {
                Ok(r) if r.source() == Source::Server => server += 1,
                Ok(r) => panic!("{k}: {:?}", r.source()),
                Err(e) => {
                    match &e {
                        Error::Unavailable(BackendError::Timeout(_)) => {
                            timed_out.insert(*node);
                        }
                        Error::Unavailable(BackendError::CircuitOpen) => assert!(
                            timed_out.contains(node),
                            "{k}: primary {node}'s circuit opened with no failure of its own"
                        ),
                        e => panic!("{k}: {e}"),
                    }
                    other += 1;
                    *errors.entry(format!("{e}")).or_insert(0u64) += 1;
                }
            }
        }
    }
    let (dead_served, dead_failed) = dead_calls.await.unwrap();
    let total = server + other;
    println!(
        "healthy primaries: {server} of {total} calls decided by the server \
         ({:.1}%); dead primary's keys: {dead_served} served, {dead_failed} failed; \
         healthy errors: {errors:?}",
        100.0 * server as f64 / total as f64
    );
    assert!(dead_failed > 0, "the dead primary's keys never failed");
    assert!(server > 0, "no healthy call was decided: {errors:?}");
}

/// A fresh cluster's first script call is a pipeline (`reserve_many`):
/// answered after a load. Then `wait_replicas` in a Cluster: the `WAIT` of
/// a call's pipeline goes to the primary of the call's key. With the replica of one primary stopped
/// (`SIGSTOP`), that primary's keys are admitted there but not used
/// (`NotReplicated`), and the keys of the other primaries are used as
/// before; once the replica runs again, so are the first primary's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_asks_the_keys_own_primary() {
    let cluster = common::Cluster::start_with(1, &[]);
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let p = RedisPace::builder(Rate::new(1, Duration::from_secs(10)).unwrap())
        .capacity(100_000)
        .timeout(Duration::from_secs(2))
        .wait_replicas(1, Duration::from_millis(100))
        .deny_cache(false)
        .prefix("w:")
        .connect_cluster(&nodes)
        .await
        .unwrap();
    // The first script call of a fresh cluster, a pipeline: the cluster
    // connection answers it with one NOSCRIPT error, and the limiter loads
    // the script and sends the pipeline again.
    let q = builder("m:").connect_cluster(&nodes).await.unwrap();
    for r in q.reserve_many(&[("a", 1), ("a", 1), ("a", 1)]).await {
        match r {
            Ok(r) => assert_eq!(r.source(), Source::Server),
            Err(Error::Denied(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let (primaries, mut admins) = primaries(&cluster);
    // Used at last, each key: for a few hundred ms after a replica's sync
    // its primary's WAIT does not count it.
    let used = |r: &Result<pace_redis::Reservation, Error>| match r {
        Ok(r) => {
            assert_eq!(r.source(), Source::Server);
            true
        }
        Err(Error::Unavailable(BackendError::NotReplicated { .. })) => false,
        Err(e) => panic!("{e}"),
    };
    let keys: Vec<String> = (0..30).map(|i| format!("key-{i}")).collect();
    let mut on = Vec::new();
    for k in &keys {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !used(&p.reserve(k).await) {
            assert!(
                std::time::Instant::now() < deadline,
                "{k}: never replicated"
            );
        }
        let at = holder(&mut admins, &p.redis_key(k));
        assert_eq!(at.len(), 1, "{k}: {at:?}");
        on.push(at[0].0);
    }
    // The replica of the first primary, stopped.
    let primary_port = cluster.nodes[primaries[0]].port.to_string();
    let replica = (0..cluster.nodes.len())
        .find(|&i| {
            cluster.nodes[i]
                .info_field("replication", "master_port")
                .as_deref()
                == Some(primary_port.as_str())
        })
        .expect("the first primary's replica");
    cluster.nodes[replica].signal("STOP");
    let (mut unused, mut others) = (0, 0);
    for (k, &at) in keys.iter().zip(&on) {
        let r = p.reserve(k).await;
        if at == 0 {
            match r {
                Err(Error::Unavailable(BackendError::NotReplicated {
                    acked: 0,
                    wanted: 1,
                })) => unused += 1,
                other => panic!("{k} on the primary whose replica stopped: {other:?}"),
            }
        } else {
            assert!(used(&r), "{k} on a primary whose replica runs: {r:?}");
            others += 1;
        }
    }
    assert!(unused > 0 && others > 0, "{on:?}");
    cluster.nodes[replica].signal("CONT");
    for (k, &at) in keys.iter().zip(&on) {
        if at == 0 {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !used(&p.reserve(k).await) {
                assert!(std::time::Instant::now() < deadline, "{k}: never again");
            }
        }
    }
    assert!(p.stats().unreplicated >= unused);
}
