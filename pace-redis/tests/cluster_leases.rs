//! A Redis Cluster primary killed (`kill -9`) while leases are in use on
//! its keys (feature `cluster`): three primaries with one replica each
//! (node timeout 1 s), two limiters connected with `connect_cluster`, with
//! leases and `wait_replicas: 1` (each primary has one replica: `WAIT 1`
//! counts every standby), the mixed traffic of `common::mixed` on the hot
//! key "hot". Its primary A dies with writes its replica B lacks:
//!
//! * B stops (`SIGSTOP`): from then on `WAIT 1` on A times out, so the
//!   limiters use nothing A decides, and A goes on deciding;
//! * a 32 MB write on A's slot fills the kernel's buffers of the
//!   replication link, so that what A writes after it stays in A's memory
//!   (A's output buffer to B is not empty when A dies: checked);
//! * once A holds `STOPPED` tokens of debits more, A is killed, B runs again
//!   (`SIGCONT`), reads what its socket held, then the link's end: it
//!   lacks every write A made after the large one (checked: B's `tat` of
//!   "hot", read before its promotion, is at least `STOPPED` tokens behind
//!   A's last);
//! * the cluster promotes B (the node timeout: no `CLUSTER FAILOVER`), the
//!   limiters' cluster client finds B serving the slot, and A, restarted
//!   empty on its port, rejoins as B's replica (which `WAIT 1` on B then
//!   counts).
//!
//! Every kept admission, at its true instant, is checked over every window
//! against the bound once B's bucket is drained again (B's room, where the
//! debits it lacks would show, used up): 0 excess. Not vacuous: each limiter lets through
//! leased and server decisions before the stop and after B's promotion
//! plus a lease time and its grace (no grant of A is in use any more:
//! none made after the stop was used), which only B can have decided: the
//! limiters reached the new primary. Runs end on counted admissions and
//! debits, never on time; every wait is bounded only by `HANG`. About
//! 8-12 s.
#![cfg(feature = "cluster")]

mod common;

use std::time::{Duration, Instant};

use common::mixed::{builder, lease_span, tat, tat_on, Run, HANG, INTERVAL, LIMITERS, LOST};
use common::{failover_leases, real_now, Cluster, RedisServer};

/// Tokens of debits A makes while B is stopped: three seconds of the rate
/// (with one second's, `LOST`, the grants `redis_lease_wait_ignored` uses
/// whatever `WAIT` answered show as excess in some runs only). A stop and
/// a failover together stay well within the horizon `τ` (10 s).
const STOPPED: u64 = 3 * LOST;

/// Bytes of the write that fills the replication link's kernel buffers
/// (the loopback's are at most a few MB each way).
const PAD: usize = 32 << 20;

/// Bytes of `primary`'s output buffer to its replica (`CLIENT LIST TYPE
/// replica`, `omem`): what it wrote that the kernel has not taken yet.
fn replica_omem(primary: &RedisServer) -> u64 {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("replica")
        .query(&mut primary.admin())
        .unwrap();
    let line = list.lines().next().expect("a replica client");
    line.split(' ')
        .find_map(|f| f.strip_prefix("omem="))
        .expect("omem")
        .parse()
        .unwrap()
}

fn role(node: &RedisServer) -> Option<String> {
    node.info_field("replication", "role")
}

/// Waits (bounded by [`HANG`]) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !cond() {
        assert!(Instant::now() < deadline, "hang: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_primary_costs_no_excess_with_leases() {
    let mut cluster = Cluster::start_with(
        1,
        &[
            "--cluster-node-timeout",
            "1000",
            // B is promoted however long it was stopped.
            "--cluster-replica-validity-factor",
            "0",
            "--repl-diskless-sync-delay",
            "0",
        ],
    );
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    // A: the primary serving "hot" (the others answer MOVED); B: its
    // replica.
    let a = (0..cluster.nodes.len())
        .find(|&i| {
            role(&cluster.nodes[i]).as_deref() == Some("master")
                && redis::cmd("GET")
                    .arg("pace:hot")
                    .query::<Option<String>>(&mut cluster.nodes[i].admin())
                    .is_ok()
        })
        .expect("the primary of \"hot\"");
    let a_port = cluster.nodes[a].port.to_string();
    let b = (0..cluster.nodes.len())
        .find(|&i| {
            cluster.nodes[i].info_field("replication", "master_port") == Some(a_port.clone())
        })
        .expect("A's replica");
    let mut limiters = Vec::new();
    for _ in 0..LIMITERS {
        limiters.push(
            builder(failover_leases())
                .connect_cluster(&nodes)
                .await
                .unwrap(),
        );
    }
    let run = Run::start(limiters);
    run.until_each_admits(0, u64::MAX, "leases on A").await;
    run.until_drained().await;

    let stopped = real_now();
    cluster.nodes[b].signal("STOP");
    let _: () = redis::cmd("SET")
        .arg("{pace:hot}pad")
        .arg(vec![b'x'; PAD])
        .query(&mut cluster.nodes[a].admin())
        .unwrap();
    let from = tat(&cluster.nodes[a]);
    until("debits while B is stopped", || {
        tat(&cluster.nodes[a]) >= from + STOPPED * INTERVAL
    })
    .await;
    let held = replica_omem(&cluster.nodes[a]);
    assert!(held > 0, "A's writes all reached B's socket");
    let last = tat(&cluster.nodes[a]);
    let killed = real_now();
    cluster.nodes[a].stop();
    cluster.nodes[b].signal("CONT");
    // B reads what its socket held, then the link's end.
    until("B saw the link end", || {
        cluster.nodes[b].info_field("replication", "master_link_status") == Some("down".into())
    })
    .await;
    let mut conn = cluster.nodes[b].admin();
    let _: () = redis::cmd("READONLY").query(&mut conn).unwrap();
    let lacks = tat_on(&mut conn);
    assert_eq!(
        role(&cluster.nodes[b]).as_deref(),
        Some("slave"),
        "read before promotion"
    );
    assert!(
        lacks + STOPPED * INTERVAL <= last,
        "B lacks less than {STOPPED} tokens of A's debits: {} ns",
        last.saturating_sub(lacks)
    );
    until("B promoted", || {
        role(&cluster.nodes[b]).as_deref() == Some("master")
    })
    .await;
    let switched = real_now();
    println!(
        "killed cluster primary: B stopped {} ms before the kill, A's output buffer to B held \
         {held} bytes, B lacks {} tokens of A's debits; promoted {} ms after the kill",
        (killed - stopped) / 1_000_000,
        (last - lacks) / INTERVAL,
        (switched - killed) / 1_000_000
    );
    // A again, empty: the cluster makes it B's replica.
    cluster.nodes[a].restart();
    let b_port = cluster.nodes[b].port.to_string();
    until("A replicates B", || {
        cluster.nodes[a].info_field("replication", "master_port") == Some(b_port.clone())
            && cluster.nodes[a].info_field("replication", "master_link_status") == Some("up".into())
    })
    .await;
    println!(
        "killed cluster primary: A replicates B {} ms after the promotion",
        (real_now() - switched) / 1_000_000
    );
    let after = switched + lease_span();
    run.until_each_admits(after, u64::MAX, "leases on B").await;
    // ... and until B's bucket is drained: B's room, the debits it lacks
    // among it, is used up before the check.
    run.until_drained().await;
    run.check("killed cluster primary", stopped, switched, after)
        .await;
}
