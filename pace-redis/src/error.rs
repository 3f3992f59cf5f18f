//! The errors: a rejected configuration, a failed connect, a call that is
//! not an admission.

use std::fmt;
use std::time::Duration;

use pace::DenyReason;
use redis::RedisError;

use crate::Denied;
#[cfg(doc)]
use crate::{Builder, EvictionCheck, OnUnavailable, RedisPace, MAX_TAU_NS};

/// A rejected configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The rate or capacity is invalid for the core crate as well.
    Pace(pace::ConfigError),
    /// `capacity x interval` exceeds [`MAX_TAU_NS`].
    TauTooLarge {
        /// The configured `capacity x interval` (saturated).
        tau_ns: u64,
        /// [`MAX_TAU_NS`].
        max_ns: u64,
    },
    /// `LocalFallback { replicas: 0 }`.
    ZeroReplicas,
    /// A zero timeout would fail every call.
    ZeroTimeout,
    /// The key prefix alone exceeds the key size limit.
    PrefixTooLong,
    /// The server's `maxmemory-policy` can evict the limiter's keys and the
    /// builder refuses it ([`EvictionCheck::Refuse`]).
    EvictingPolicy {
        /// The policy, as the server reports it.
        policy: String,
    },
    /// [`Builder::hold_limit`] is zero or exceeds [`MAX_TAU_NS`].
    HoldLimit {
        /// The configured limit (ns, saturated).
        ns: u64,
    },
    /// [`Builder::leases`]: a zero lease time, a lease time plus grace
    /// above [`MAX_TAU_NS`], `eps_ppm` of 10^6 or more, a zero `hot_after`
    /// or `max_keys`, or with `wait_replicas`, a zero `wait_timeout` or one
    /// above the limiter's timeout.
    Leases,
    /// [`Builder::wait_replicas`]: zero standbys, a zero timeout or one
    /// above the limiter's timeout, or a `wait_replicas` of
    /// [`Builder::leases`] that differs from the builder's.
    WaitReplicas,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Pace(e) => write!(f, "{e}"),
            ConfigError::TauTooLarge { tau_ns, max_ns } => write!(
                f,
                "capacity x interval = {tau_ns} ns exceeds {max_ns} ns (2^50, ~13 days): \
                 Lua numbers would lose precision"
            ),
            ConfigError::ZeroReplicas => f.write_str("LocalFallback needs at least 1 replica"),
            ConfigError::ZeroTimeout => f.write_str("the timeout must be longer than zero"),
            ConfigError::PrefixTooLong => f.write_str("the key prefix exceeds the key size limit"),
            ConfigError::EvictingPolicy { policy } => write!(
                f,
                "the server's maxmemory-policy {policy} can evict the limiter's keys \
                 (a lost key hands out a full bucket); use noeviction"
            ),
            ConfigError::Leases => f.write_str(
                "leases: a zero lease time or hot_after or max_keys, lease + grace above 2^50 ns, \
                 eps_ppm of 10^6 or more, or a wait_timeout of zero or above the timeout",
            ),
            ConfigError::WaitReplicas => f.write_str(
                "wait_replicas: zero standbys, a timeout of zero or above the limiter's, \
                 or two different settings (the builder's and the leases')",
            ),
            ConfigError::HoldLimit { ns } => write!(
                f,
                "hold limit of {ns} ns: it must be at least 1 ns and at most 2^50 ns"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why Redis gave no decision.
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// No answer within the configured timeout.
    Timeout(Duration),
    /// A connection or server error.
    Redis(RedisError),
    /// A recent failure: Redis is not tried again until the backoff passes.
    CircuitOpen,
    /// The stored `tat` lies further ahead of the server's clock than any
    /// bucket can (the server's clock went back by days).
    ClockOutOfRange,
    /// The script answered something this crate does not understand.
    BadReply(String),
    /// No connection yet: the server was unreachable at start and the
    /// limiter connects in the background.
    NotConnected,
    /// The server admitted, but fewer standbys than
    /// [`Builder::wait_replicas`] acknowledged the admission's write within
    /// its timeout: a failover could lose it, so it is not used (its tokens
    /// go back in the background: a hold released, a reserve or a turn
    /// refunded).
    NotReplicated {
        /// Standbys that acknowledged (`WAIT`'s answer).
        acked: u64,
        /// Standbys required.
        wanted: u32,
    },
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Timeout(d) => write!(f, "no answer from redis within {d:?}"),
            BackendError::Redis(e) => write!(f, "redis: {e}"),
            BackendError::CircuitOpen => f.write_str("redis failed recently; not retried yet"),
            BackendError::ClockOutOfRange => {
                f.write_str("stored state lies days ahead of the server's clock")
            }
            BackendError::BadReply(s) => write!(f, "unexpected script reply: {s}"),
            BackendError::NotConnected => f.write_str("not connected to redis yet"),
            BackendError::NotReplicated { acked, wanted } => write!(
                f,
                "{acked} of {wanted} standbys acknowledged the admission in time: not used"
            ),
        }
    }
}

/// Why a key was refused before any decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    /// The empty key.
    Empty,
    /// Prefix plus key exceed the configured maximum size.
    TooLong {
        /// Bytes of prefix plus key.
        bytes: usize,
        /// The configured maximum.
        max: usize,
    },
}

/// Everything that is not an admission.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The bucket lacks the tokens (or never will hold them).
    Denied(Denied),
    /// The key is empty or too long; nothing was sent.
    InvalidKey(KeyError),
    /// Redis gave no decision and the policy is [`OnUnavailable::FailClosed`].
    /// [`RedisPace::unavailable_for`] tells when a call on the key tries
    /// Redis again (the rest of the circuit's backoff).
    Unavailable(BackendError),
    /// An `_at` method was called without [`Builder::time_injection`].
    TimeInjectionDisabled,
    /// A call's own quota is outside what the script computes exactly:
    /// [`ConfigError::TauTooLarge`] when its `capacity x interval` exceeds
    /// [`MAX_TAU_NS`]. Nothing was sent.
    InvalidQuota(ConfigError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Denied(d) => match d.reason {
                DenyReason::Exhausted | DenyReason::Held => {
                    write!(f, "rate exceeded; retry after {:?}", d.retry_after())
                }
                _ => f.write_str("request exceeds the bucket's capacity"),
            },
            Error::InvalidKey(KeyError::Empty) => f.write_str("empty key"),
            Error::InvalidKey(KeyError::TooLong { bytes, max }) => {
                write!(f, "key of {bytes} bytes exceeds {max}")
            }
            Error::Unavailable(e) => write!(f, "limiter unavailable: {e}"),
            Error::TimeInjectionDisabled => {
                f.write_str("time injection is disabled (Builder::time_injection)")
            }
            Error::InvalidQuota(e) => write!(f, "quota rejected: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// Why [`Builder::connect`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// The configuration is rejected.
    Config(ConfigError),
    /// The URL (or a node's, or a Sentinel's) does not parse; nothing was
    /// tried.
    InvalidUrl(RedisError),
    /// The server refused the login: no password where it requires one
    /// (`NOAUTH`), or a wrong one (`WRONGPASS`). Under either policy: the
    /// server answered, it is not down.
    Auth(RedisError),
    /// The TLS handshake failed: the server's certificate is not trusted
    /// (an unknown issuer, another host name) or the server refused the
    /// client's; or the configured certificates do not parse. Under either
    /// policy.
    Tls(RedisError),
    /// The server could not be reached (under
    /// [`OnUnavailable::FailClosed`]), or another error.
    Redis(RedisError),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Config(e) => write!(f, "bad configuration: {e}"),
            ConnectError::InvalidUrl(e) => write!(f, "the redis URL does not parse: {e}"),
            ConnectError::Auth(e) => write!(f, "redis refused the login: {e}"),
            ConnectError::Tls(e) => write!(f, "the TLS handshake with redis failed: {e}"),
            ConnectError::Redis(e) => write!(f, "cannot reach redis: {e}"),
        }
    }
}

impl std::error::Error for ConnectError {}
