//! The lease protocol of a shared limit, as an exact integer event model
//! (checked by `tests/leases.rs`): one key, several replicas, and a server
//! that decides with its own clock by the rule of holds (DESIGN.md §11).
//!
//! * A **lease** is a server-side hold for `(replica, lease id)`. One call
//!   takes or renews it: it settles the replica's cumulative kept tokens
//!   as kept **at the call's own reading**, releases its cumulative
//!   released tokens, grants more held tokens up to the replica's share,
//!   and sets the lease's expiry to the reading plus the lease time `L`.
//! * The replica spends granted tokens locally, only before a **deadline**
//!   on its own clock: the local instant it **sent** the granting call plus
//!   the lease's remaining time less the drift margin `ε_max`.
//! * Reports are **cumulative**, so a duplicated or retried call applies
//!   once.
//! * A lease past its expiry plus a grace is **settled as kept** from that
//!   instant by the next call on the key, and its record removed; a later
//!   call for it is answered `Unknown` and the replica strands what it had.
//! * With a standby (a failover during the run), every reply leaves only
//!   once the call's writes are replicated (`WAIT 1` after the call).
//!
//! Every kept admission is recorded at the **true** instant it was let
//! through (the local instant for a leased token, the server's reading for
//! a decision of the server), and the history is checked by
//! [`bound::worst_excess_ns`](crate::bound::worst_excess_ns) over every
//! window. Replica clocks run at their own rate, within `±ε_max` of true
//! time, from their own offsets; the network delays, duplicates and loses
//! messages; replicas die (`kill -9`) and come back as new replicas.
//!
//! The known-wrong variants (`PACE_MUTANT`, this crate's `build.rs`) are
//! pairs of functions below, the right one under `cfg(not(..))`:
//!
//! | variant | what the wrong one does |
//! |---|---|
//! | `lease_keep_from_grant` | reported kept tokens settle from the lease's first grant's reading |
//! | `lease_deadline_from_reply` | the deadline is counted from the reply's arrival |
//! | `lease_delta_reports` | reports are deltas since the last call sent |
//! | `lease_expiry_refunds` | an expired lease is dropped as if refunded |
//! | `lease_reply_unreplicated` | a reply leaves before the call's writes reach the standby |

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The drift margin's unit: `ε_max` is given in parts per million.
pub const PPM: i128 = 1_000_000;

/// One history's shape, drawn from its seed by [`Params::random`].
#[derive(Clone, Debug)]
pub struct Params {
    /// Nanoseconds per token.
    pub interval: u64,
    /// Bucket capacity in tokens.
    pub capacity: u64,
    /// Replicas alive at a time.
    pub replicas: usize,
    /// The lease time `L`, ns.
    pub lease: u64,
    /// The grace after an expiry before the lease settles, ns.
    pub grace: u64,
    /// `ε_max`, parts per million: every replica's clock rate is within it.
    pub eps_ppm: u64,
    /// Tokens a replica asks for in one call.
    pub want: u64,
    /// Mean time between a replica's requests, ns.
    pub gap: u64,
    /// Longest ordinary one-way delay, ns.
    pub delay: u64,
    /// Per mille of messages delayed up to `3 L` instead.
    pub slow_permille: u32,
    /// Per mille of calls delivered twice.
    pub dup_permille: u32,
    /// Per mille of replies lost.
    pub loss_permille: u32,
    /// Per mille of requests at which their replica dies.
    pub crash_permille: u32,
    /// Failovers during the run (0: no standby).
    pub failovers: u32,
    /// Longest replication lag to the standby, ns.
    pub lag: u64,
    /// Requests per replica slot over the run.
    pub requests: u32,
}

impl Params {
    /// A history's shape from its seed, with `ε_max` = 0.1%; `failover`
    /// gives it a standby and failovers.
    pub fn random(seed: u64, failover: bool) -> Params {
        Params::random_drift(seed, failover, 1_000)
    }

    /// The same with `ε_max` = `eps_ppm` parts per million.
    pub fn random_drift(seed: u64, failover: bool, eps_ppm: u64) -> Params {
        let mut rng = StdRng::seed_from_u64(seed);
        let interval = rng.gen_range(1_000..=100_000u64);
        let capacity = *[1u64, 2, 3, 5, 10, 40, 200]
            .get(rng.gen_range(0..7))
            .expect("in range");
        let replicas = rng.gen_range(2..=6);
        let tau = interval * capacity;
        let lease = (tau / 2).max(interval) * rng.gen_range(1..=8);
        let want = rng.gen_range(1..=capacity.div_ceil(2).max(1));
        // Demand from 0.3 to 4 times the limit.
        let load_permille = rng.gen_range(300..=4_000u64);
        let gap = (interval * replicas as u64 * 1_000 / load_permille).max(1);
        Params {
            interval,
            capacity,
            replicas,
            lease,
            grace: [0, interval / 3, lease / 4][rng.gen_range(0..3)],
            eps_ppm,
            want,
            gap,
            delay: [interval / 10, interval, lease / 2][rng.gen_range(0..3)].max(1),
            slow_permille: rng.gen_range(0..=80),
            dup_permille: rng.gen_range(0..=150),
            loss_permille: rng.gen_range(0..=80),
            crash_permille: rng.gen_range(0..=8),
            failovers: if failover { rng.gen_range(1..=3) } else { 0 },
            lag: if failover {
                [interval, lease / 2, lease * 2][rng.gen_range(0..3)].max(1)
            } else {
                0
            },
            requests: rng.gen_range(150..=400),
        }
    }

    fn tau(&self) -> i128 {
        i128::from(self.interval) * i128::from(self.capacity)
    }
}

/// What a history did, to show the tests reach every part of the protocol.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Requests let through from a lease's local counter.
    pub leased: u64,
    /// Requests decided by the server (a lease could not serve them).
    pub direct: u64,
    /// Tokens granted.
    pub granted: u64,
    /// Tokens released by reports.
    pub released: u64,
    /// Leases settled as kept at their expiry.
    pub expired: u64,
    /// Tokens held by those leases (never reported used or released).
    pub stranded: u64,
    /// Calls delivered twice.
    pub duplicates: u64,
    /// Calls answered `Unknown`.
    pub unknown: u64,
    /// Replicas killed.
    pub kills: u64,
    /// Failovers.
    pub failovers: u64,
    /// Replies lost with a failed primary.
    pub lost_with_primary: u64,
    /// Leased reservations refunded locally.
    pub refunded: u64,
}

/// A lease as the server holds it. Counts are cumulative for the lease.
#[derive(Clone, Debug)]
struct Lease {
    granted: u64,
    kept: u64,
    released: u64,
    /// Server reading of the expiry.
    expiry: i128,
    /// Server reading of its creation: the replica tells a record created
    /// again under its id (a late duplicate of its first call) by it.
    born: i128,
}

impl Lease {
    fn held(&self) -> u64 {
        self.granted - self.kept - self.released
    }
}

/// The server's state for the key: GCRA's settled `tat` and the leases.
#[derive(Clone, Debug, Default)]
struct Server {
    tat: i128,
    leases: BTreeMap<(usize, u64), Lease>,
}

/// A take/renew call as sent.
#[derive(Clone, Debug)]
struct Call {
    replica: usize,
    lease_id: u64,
    /// The first call of this lease id: creates the record.
    first: bool,
    kept: u64,
    released: u64,
    want: u64,
    /// The replica's local reading when it sent the call.
    sent_local: i128,
    /// The replica's number for the call.
    seq: u64,
}

/// A take/renew call's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The lease lives.
    Granted {
        /// Tokens granted to the lease so far, this call's included.
        granted: u64,
        /// Its expiry less the call's reading, ns.
        remaining: i128,
        /// The server's reading when the lease's record was created.
        born: i128,
    },
    /// No record of the lease (settled at its expiry) and the call is not
    /// its first.
    Unknown,
}

#[derive(Clone, Debug)]
enum Event {
    Request(usize),
    /// A leased reservation resolved: kept or refunded.
    Resolve {
        replica: usize,
        lease_id: u64,
        n: u64,
        at: u64,
        keep: bool,
    },
    CallArrives(Call),
    /// `leaves`: the server's reading when the reply left; a reply that
    /// would leave after its primary failed (`epoch` ended) never does.
    ReplyArrives {
        call: Call,
        answer: Answer,
        epoch: usize,
        leaves: i128,
    },
    DirectArrives {
        replica: usize,
        n: u64,
    },
    DirectReply {
        admitted_at: u64,
        n: u64,
        replica: usize,
        epoch: usize,
        leaves: i128,
    },
    Timeout {
        replica: usize,
        seq: u64,
    },
    Failover,
}

#[derive(Clone, Debug)]
struct Replica {
    alive: bool,
    offset: i128,
    /// Rate error, ppm, within `±ε_max`.
    ppm: i128,
    lease_id: u64,
    first: bool,
    born: Option<i128>,
    granted: u64,
    kept: u64,
    released: u64,
    /// Reserved locally, neither kept nor refunded yet.
    out: u64,
    /// Local reading before which granted tokens may be spent.
    deadline: i128,
    /// The call in flight (its sequence number), if any.
    inflight: Option<u64>,
    seq: u64,
    /// What the last call sent reported (the delta variant's baseline).
    sent_kept: u64,
    sent_released: u64,
}

impl Replica {
    fn local(&self, t: u64) -> i128 {
        self.offset + (i128::from(t) * (PPM + self.ppm)).div_euclid(PPM)
    }

    fn pool(&self) -> u64 {
        self.granted
            .saturating_sub(self.kept + self.released + self.out)
    }

    fn usable(&self, t: u64, n: u64) -> bool {
        self.alive && self.local(t) < self.deadline && self.pool() >= n
    }

    /// Starts a new lease id: whatever the old one had is stranded (the
    /// server settled it as kept at its expiry).
    fn strand(&mut self) {
        self.lease_id += 1;
        self.first = true;
        self.born = None;
        self.granted = 0;
        self.kept = 0;
        self.released = 0;
        self.out = 0;
        self.deadline = i128::MIN;
        self.sent_kept = 0;
        self.sent_released = 0;
    }
}

// ---- the variant pairs -------------------------------------------------

/// The reading reported kept tokens settle from: the call's own.
#[cfg(not(pace_mutant = "lease_keep_from_grant"))]
fn keep_reading(_lease: &Lease, now: i128) -> i128 {
    now
}

/// Known-wrong: from the lease's first grant, before the tokens were used.
#[cfg(pace_mutant = "lease_keep_from_grant")]
fn keep_reading(lease: &Lease, _now: i128) -> i128 {
    lease.born
}

/// The local instant a deadline is counted from: the send.
#[cfg(not(pace_mutant = "lease_deadline_from_reply"))]
fn deadline_from(sent_local: i128, _arrived_local: i128) -> i128 {
    sent_local
}

/// Known-wrong: the reply's arrival.
#[cfg(pace_mutant = "lease_deadline_from_reply")]
fn deadline_from(_sent_local: i128, arrived_local: i128) -> i128 {
    arrived_local
}

/// What a call reports: the replica's cumulative counts.
#[cfg(not(pace_mutant = "lease_delta_reports"))]
fn report(r: &mut Replica) -> (u64, u64) {
    (r.kept, r.released)
}

/// Known-wrong: the counts since the last call sent.
#[cfg(pace_mutant = "lease_delta_reports")]
fn report(r: &mut Replica) -> (u64, u64) {
    let delta = (r.kept - r.sent_kept, r.released - r.sent_released);
    (r.sent_kept, r.sent_released) = (r.kept, r.released);
    delta
}

/// The newly kept and released tokens of a report: beyond what the lease
/// already applied.
#[cfg(not(pace_mutant = "lease_delta_reports"))]
fn applied(lease: &Lease, kept: u64, released: u64) -> (u64, u64) {
    (
        kept.saturating_sub(lease.kept),
        released.saturating_sub(lease.released),
    )
}

/// Known-wrong: a report is applied as it comes, once per delivery.
#[cfg(pace_mutant = "lease_delta_reports")]
fn applied(_lease: &Lease, kept: u64, released: u64) -> (u64, u64) {
    (kept, released)
}

/// An expired lease's held tokens settle as kept from `expiry + grace`.
#[cfg(not(pace_mutant = "lease_expiry_refunds"))]
fn settle_expired(tat: i128, lease: &Lease, grace: i128, interval: i128) -> i128 {
    tat.max(lease.expiry + grace) + i128::from(lease.held()) * interval
}

/// Known-wrong: dropped as if refunded.
#[cfg(pace_mutant = "lease_expiry_refunds")]
fn settle_expired(tat: i128, _lease: &Lease, _grace: i128, _interval: i128) -> i128 {
    tat
}

/// The local time a lease with `remaining` ns left on the server's clock
/// may be used for: less the drift margin.
#[cfg(not(pace_mutant = "lease_no_drift_margin"))]
fn usable_for(remaining: i128, eps_ppm: i128) -> i128 {
    remaining * (PPM - eps_ppm) / PPM
}

/// Known-wrong: all of it, on a clock that may run fast or slow.
#[cfg(pace_mutant = "lease_no_drift_margin")]
fn usable_for(remaining: i128, _eps_ppm: i128) -> i128 {
    remaining
}

/// When a reply leaves the server: once the call's writes are on the
/// standby (`WAIT 1`), where there is one.
#[cfg(not(pace_mutant = "lease_reply_unreplicated"))]
fn reply_leaves(_now: i128, replicated_at: i128) -> i128 {
    replicated_at
}

/// Known-wrong: at once, before the standby has the grant.
#[cfg(pace_mutant = "lease_reply_unreplicated")]
fn reply_leaves(now: i128, _replicated_at: i128) -> i128 {
    now
}

// ---- the server ----------------------------------------------------------

impl Server {
    fn held(&self) -> i128 {
        self.leases.values().map(|l| i128::from(l.held())).sum()
    }

    /// Settles every lease past its expiry plus the grace, earliest first.
    fn settle(&mut self, p: &Params, now: i128, stats: &mut Stats) {
        let grace = i128::from(p.grace);
        let mut due: Vec<((usize, u64), i128)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expiry + grace <= now)
            .map(|(&k, l)| (k, l.expiry))
            .collect();
        due.sort_by_key(|&(k, e)| (e, k));
        for (k, _) in due {
            let lease = self.leases.remove(&k).expect("listed");
            if lease.held() > 0 {
                stats.expired += 1;
                stats.stranded += lease.held();
            }
            self.tat = settle_expired(self.tat, &lease, grace, i128::from(p.interval));
        }
    }

    /// Debt at `now` in ns: the settled part and every held token.
    fn debt(&self, p: &Params, now: i128) -> i128 {
        self.tat.max(now) - now + self.held() * i128::from(p.interval)
    }

    /// A decision of the server on `n` tokens (a call no lease serves).
    fn direct(&mut self, p: &Params, now: i128, n: u64, stats: &mut Stats) -> bool {
        self.settle(p, now, stats);
        let need = i128::from(n) * i128::from(p.interval);
        let tau = p.tau();
        if self.debt(p, now) + need <= tau && self.held() * i128::from(p.interval) + need <= tau {
            self.tat = self.tat.max(now) + need;
            true
        } else {
            false
        }
    }

    /// A take/renew call at the server's reading `now`.
    fn call(&mut self, p: &Params, now: i128, c: &Call, stats: &mut Stats) -> Answer {
        self.settle(p, now, stats);
        let key = (c.replica, c.lease_id);
        if let std::collections::btree_map::Entry::Vacant(e) = self.leases.entry(key) {
            if !c.first {
                return Answer::Unknown;
            }
            e.insert(Lease {
                granted: 0,
                kept: 0,
                released: 0,
                expiry: now,
                born: now,
            });
        }
        let t = i128::from(p.interval);
        let lease = self.leases.get_mut(&key).expect("present");
        let (dk, dr) = applied(lease, c.kept, c.released);
        let dk = dk.min(lease.held());
        let dr = dr.min(lease.held() - dk);
        if dk > 0 {
            self.tat = self.tat.max(keep_reading(lease, now)) + i128::from(dk) * t;
            lease.kept += dk;
        }
        lease.released += dr;
        stats.released += dr;
        let others = self
            .leases
            .iter()
            .filter(|(k, l)| **k != key && l.held() > 0)
            .count() as u64;
        let room = (p.tau() - self.debt(p, now)).max(0) / t;
        // A share: at most twice an equal one while others hold tokens.
        let share = (p.capacity / (2 * (others + 1))).max(1);
        let g = c.want.min(room as u64).min(share);
        let lease = self.leases.get_mut(&key).expect("present");
        lease.granted += g;
        lease.expiry = now + i128::from(p.lease);
        stats.granted += g;
        Answer::Granted {
            granted: lease.granted,
            remaining: lease.expiry - now,
            born: lease.born,
        }
    }
}

/// The model's server alone, for scenarios written by hand (and for a
/// port of the protocol to be checked against): one key's settled `tat`
/// and its leases, deciding at the readings it is given.
pub struct LeaseServer {
    p: Params,
    server: Server,
    stats: Stats,
}

impl LeaseServer {
    /// A key of `capacity` tokens, one per `interval` ns; leases of
    /// `lease` ns, settled `grace` ns after their expiry; each call asks
    /// for what it names.
    pub fn new(interval: u64, capacity: u64, lease: u64, grace: u64) -> LeaseServer {
        let mut p = Params::random(0, false);
        (p.interval, p.capacity, p.lease, p.grace) = (interval, capacity, lease, grace);
        LeaseServer {
            p,
            server: Server::default(),
            stats: Stats::default(),
        }
    }

    /// A take/renew call of `replica`'s lease `lease_id` at the reading
    /// `now`: `first` for the call that may create it, the replica's
    /// cumulative `kept` and `released` counts, and `want` more tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &mut self,
        now: i128,
        replica: usize,
        lease_id: u64,
        first: bool,
        kept: u64,
        released: u64,
        want: u64,
    ) -> Answer {
        let call = Call {
            replica,
            lease_id,
            first,
            kept,
            released,
            want,
            sent_local: 0,
            seq: 0,
        };
        self.server.call(&self.p, now, &call, &mut self.stats)
    }

    /// A decision of `n` tokens at the reading `now` (a call no lease
    /// serves).
    pub fn direct(&mut self, now: i128, n: u64) -> bool {
        self.server.direct(&self.p, now, n, &mut self.stats)
    }

    /// The key's settled `tat`, ns.
    pub fn tat(&self) -> i128 {
        self.server.tat
    }

    /// Tokens held by leases.
    pub fn held(&self) -> u64 {
        self.server.leases.values().map(Lease::held).sum()
    }
}

// ---- the history -----------------------------------------------------------

struct Sim {
    p: Params,
    rng: StdRng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Event>>,
    primary: Server,
    standby: Server,
    /// Writes on their way to the standby: (instant it has them, state).
    log: VecDeque<(i128, Server)>,
    /// Failover instants, one per ended epoch.
    ended: Vec<i128>,
    replicas: Vec<Replica>,
    kept: Vec<(u64, u64)>,
    stats: Stats,
}

impl Sim {
    fn at(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.events.push(Some(e));
        self.queue
            .push(Reverse((t, self.seq, self.events.len() - 1)));
    }

    fn delay(&mut self) -> u64 {
        if self.rng.gen_range(0..1000) < self.p.slow_permille {
            self.rng.gen_range(0..=3 * self.p.lease)
        } else {
            self.rng.gen_range(0..=self.p.delay)
        }
    }

    fn new_replica(&mut self) -> usize {
        let eps = self.p.eps_ppm as i128;
        let r = Replica {
            alive: true,
            offset: self.rng.gen_range(-1_000_000_000i128..=1_000_000_000),
            ppm: self.rng.gen_range(-eps..=eps),
            lease_id: 0,
            first: true,
            born: None,
            granted: 0,
            kept: 0,
            released: 0,
            out: 0,
            deadline: i128::MIN,
            inflight: None,
            seq: 0,
            sent_kept: 0,
            sent_released: 0,
        };
        self.replicas.push(r);
        self.replicas.len() - 1
    }

    /// The server's writes of a call made at `now`: when the standby has
    /// them (at once without one).
    fn replicate(&mut self, now: i128) -> i128 {
        if self.p.failovers == 0 {
            return now;
        }
        let lag = i128::from(self.rng.gen_range(0..=self.p.lag));
        let last = self.log.back().map_or(now, |&(t, _)| t);
        let at = (now + lag).max(last);
        self.log.push_back((at, self.primary.clone()));
        at
    }

    fn send_call(&mut self, r: usize) {
        let t = self.now;
        let rep = &mut self.replicas[r];
        rep.seq += 1;
        let seq = rep.seq;
        rep.inflight = Some(seq);
        let (kept, released) = report(rep);
        let call = Call {
            replica: r,
            lease_id: rep.lease_id,
            first: rep.first,
            kept,
            released,
            want: self.p.want,
            sent_local: rep.local(t),
            seq,
        };
        let d = self.delay();
        self.at(t + d, Event::CallArrives(call.clone()));
        if self.rng.gen_range(0..1000) < self.p.dup_permille {
            self.stats.duplicates += 1;
            let d = self.delay();
            self.at(t + d, Event::CallArrives(call));
        }
        let timeout = 2 * self.p.delay + self.p.interval;
        self.at(t + timeout, Event::Timeout { replica: r, seq });
    }

    fn request(&mut self, r: usize) {
        let t = self.now;
        if !self.replicas[r].alive {
            return;
        }
        if self.rng.gen_range(0..1000) < self.p.crash_permille {
            // kill -9: its pool is lost; a restart is a new replica.
            self.replicas[r].alive = false;
            self.stats.kills += 1;
            let fresh = self.new_replica();
            let gap = self.rng.gen_range(0..=2 * self.p.gap);
            self.at(t + gap, Event::Request(fresh));
            return;
        }
        let n = self.rng.gen_range(1..=self.p.capacity.min(3));
        let kind = self.rng.gen_range(0..100);
        let leased = kind < 90 && self.replicas[r].usable(t, n);
        if leased {
            self.stats.leased += 1;
            let rep = &mut self.replicas[r];
            if kind < 70 {
                rep.kept += n;
                self.kept.push((t, n));
            } else {
                // A reservation (or hold) resolved later: kept from its
                // decision, or refunded to the lease.
                rep.out += n;
                let lease_id = rep.lease_id;
                let keep = self.rng.gen_bool(0.5);
                let later = self.rng.gen_range(0..=self.p.lease);
                self.at(
                    t + later,
                    Event::Resolve {
                        replica: r,
                        lease_id,
                        n,
                        at: t,
                        keep,
                    },
                );
            }
        } else {
            // A call the lease cannot decide goes to the server.
            let d = self.delay();
            self.at(t + d, Event::DirectArrives { replica: r, n });
        }
        if self.rng.gen_range(0..100) < 4 {
            // Stops using part of its pool: released at the next call.
            let rep = &mut self.replicas[r];
            let x = rep.pool() / 2;
            rep.released += x;
        }
        let rep = &self.replicas[r];
        let low = rep.pool() < self.p.want.div_ceil(2)
            || rep.local(t) + i128::from(self.p.lease / 4) >= rep.deadline;
        if rep.inflight.is_none() && low {
            self.send_call(r);
        }
        let gap = self.rng.gen_range(0..=2 * self.p.gap);
        self.at(t + gap, Event::Request(r));
    }

    /// Whether a reply that leaves at `leaves` in `epoch` is lost with its
    /// primary.
    fn lost(&self, epoch: usize, leaves: i128) -> bool {
        epoch < self.ended.len() && leaves > self.ended[epoch]
    }

    fn reply(&mut self, call: Call, answer: Answer, epoch: usize, leaves: i128) {
        if self.lost(epoch, leaves) {
            // The primary died before its standby had the call's writes:
            // its WAIT never returned.
            self.stats.lost_with_primary += 1;
            return;
        }
        let t = self.now;
        let rep = &mut self.replicas[call.replica];
        if !rep.alive || call.lease_id != rep.lease_id {
            return;
        }
        if rep.inflight == Some(call.seq) {
            rep.inflight = None;
        }
        match answer {
            Answer::Unknown => {
                self.stats.unknown += 1;
                rep.strand();
            }
            Answer::Granted {
                granted,
                remaining,
                born,
            } => {
                if rep.born.is_some_and(|b| b != born) {
                    // The record was created again by a late duplicate of
                    // the first call: the old one was settled.
                    rep.strand();
                    return;
                }
                rep.born = Some(born);
                rep.first = false;
                rep.granted = rep.granted.max(granted);
                let margin = usable_for(remaining, self.p.eps_ppm as i128);
                let from = deadline_from(call.sent_local, rep.local(t));
                rep.deadline = rep.deadline.max(from + margin);
            }
        }
    }

    fn step(&mut self, e: Event) {
        let now = i128::from(self.now);
        match e {
            Event::Request(r) => self.request(r),
            Event::Resolve {
                replica,
                lease_id,
                n,
                at,
                keep,
            } => {
                let rep = &mut self.replicas[replica];
                // A killed replica refunds nothing: what it let through
                // stays kept.
                let keep = keep || !rep.alive;
                if keep {
                    self.kept.push((at, n));
                } else {
                    self.stats.refunded += 1;
                }
                if rep.alive && rep.lease_id == lease_id {
                    rep.out -= n;
                    if keep {
                        rep.kept += n;
                    }
                }
            }
            Event::CallArrives(call) => {
                let answer = self.primary.call(&self.p, now, &call, &mut self.stats);
                let replicated = self.replicate(now);
                let leaves = reply_leaves(now, replicated);
                let back = self.delay();
                if self.rng.gen_range(0..1000) >= self.p.loss_permille {
                    let epoch = self.ended.len();
                    self.at(
                        leaves as u64 + back,
                        Event::ReplyArrives {
                            call,
                            answer,
                            epoch,
                            leaves,
                        },
                    );
                }
            }
            Event::ReplyArrives {
                call,
                answer,
                epoch,
                leaves,
            } => self.reply(call, answer, epoch, leaves),
            Event::DirectArrives { replica, n } => {
                let admitted = self.primary.direct(&self.p, now, n, &mut self.stats);
                let replicated = self.replicate(now);
                if admitted {
                    let leaves = reply_leaves(now, replicated);
                    let back = self.delay();
                    let epoch = self.ended.len();
                    self.at(
                        leaves as u64 + back,
                        Event::DirectReply {
                            admitted_at: self.now,
                            n,
                            replica,
                            epoch,
                            leaves,
                        },
                    );
                }
            }
            Event::DirectReply {
                admitted_at,
                n,
                replica,
                epoch,
                leaves,
            } => {
                if self.lost(epoch, leaves) {
                    self.stats.lost_with_primary += 1;
                } else if self.replicas[replica].alive {
                    // Let through at the server's reading of its decision.
                    self.stats.direct += 1;
                    self.kept.push((admitted_at, n));
                }
            }
            Event::Timeout { replica, seq } => {
                let rep = &mut self.replicas[replica];
                if rep.inflight == Some(seq) {
                    rep.inflight = None;
                }
            }
            Event::Failover => {
                // The standby, with every write that reached it, becomes
                // the primary; a new standby starts from it.
                while self.log.front().is_some_and(|&(t, _)| t <= now) {
                    let (_, s) = self.log.pop_front().expect("front");
                    self.standby = s;
                }
                self.log.clear();
                self.primary = self.standby.clone();
                self.ended.push(now);
                self.stats.failovers += 1;
            }
        }
    }
}

/// Runs the history of `seed`: the worst excess over every window of its
/// kept admissions in ns (at most 0 when the bound holds) and what it did.
pub fn run(seed: u64, failover: bool) -> (Params, i128, Stats) {
    run_params(seed, Params::random(seed, failover))
}

/// The same for a history of shape `p`.
pub fn run_params(seed: u64, p: Params) -> (Params, i128, Stats) {
    let mut sim = Sim {
        rng: StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
        p: p.clone(),
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        events: Vec::new(),
        primary: Server::default(),
        standby: Server::default(),
        log: VecDeque::new(),
        ended: Vec::new(),
        replicas: Vec::new(),
        kept: Vec::new(),
        stats: Stats::default(),
    };
    let end = p.gap * u64::from(p.requests);
    for _ in 0..p.replicas {
        let r = sim.new_replica();
        let t = sim.rng.gen_range(0..=p.gap);
        sim.at(t, Event::Request(r));
    }
    for _ in 0..p.failovers {
        let t = sim.rng.gen_range(end / 4..=end);
        sim.at(t, Event::Failover);
    }
    while let Some(Reverse((t, _, i))) = sim.queue.pop() {
        if t > end {
            break;
        }
        sim.now = t;
        let e = sim.events[i].take().expect("each event runs once");
        sim.step(e);
    }
    let worst = crate::bound::worst_excess_ns(&mut sim.kept, p.capacity, p.interval);
    (p, worst, sim.stats)
}
