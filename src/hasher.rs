//! Hashing keys. A limiter whose hasher is std's `RandomState` (the
//! default) hashes with SipHash-1-3, the function `RandomState`'s hashers
//! compute, as the `siphasher` crate writes it, under a random 128-bit key
//! of its own drawn when it is built: std's hasher buffers every write as
//! bytes, so an integer key (a word-sized key, `IpPrefix`) costs it about
//! 50 more instructions than `siphasher`, which takes integers whole. Any
//! other hasher hashes as it is.

use std::any::TypeId;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};

use siphasher::sip::SipHasher13;

/// Whether `S` is std's `RandomState`, whose limiters hash with [`Sip`].
#[inline(always)]
pub(crate) fn sip_for<S: ?Sized>() -> bool {
    typeid::of::<S>() == TypeId::of::<RandomState>()
}

/// A SipHash-1-3 key.
#[derive(Clone, Copy)]
pub(crate) struct Sip {
    k0: u64,
    k1: u64,
}

impl Sip {
    /// The key of every limiter in a build with `PACE_FIXED_SIP=1`.
    const FIXED: Sip = Sip {
        k0: 0x1234_5678_9abc_def1,
        k1: 0x0fed_cba9_8765_4321,
    };

    /// The key of a limiter whose hasher is of type `S`: when it is std's
    /// `RandomState`, a key of its own, two outputs of a fresh
    /// `RandomState` (whose key comes from the operating system's entropy);
    /// zero, and unused, otherwise.
    pub(crate) fn for_hasher<S: ?Sized>() -> Sip {
        if sip_for::<S>() {
            if cfg!(pace_fixed_sip) {
                // A build with `PACE_FIXED_SIP=1` (build.rs), for comparing
                // two builds' instruction counts: one key for every limiter.
                return Sip::FIXED;
            }
            let seed = RandomState::new();
            Sip {
                k0: seed.hash_one(0x7061_6365_u64),
                k1: seed.hash_one(0x7369_7068_u64),
            }
        } else {
            Sip { k0: 0, k1: 0 }
        }
    }

    /// SipHash-1-3 of `key` under this key.
    #[inline(always)]
    pub(crate) fn hash_one<Q: ?Sized + Hash>(&self, key: &Q) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        key.hash(&mut h);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasherDefault, DefaultHasher};

    use super::{sip_for, Sip};

    /// SipHash-1-3 of one 8-byte message, written out from the algorithm's
    /// paper (one compression round a block, three finalization rounds):
    /// the reference the limiter's hash is checked against.
    fn sip13_of_word(k0: u64, k1: u64, m: u64) -> u64 {
        let mut v = [
            k0 ^ 0x736f_6d65_7073_6575,
            k1 ^ 0x646f_7261_6e64_6f6d,
            k0 ^ 0x6c79_6765_6e65_7261,
            k1 ^ 0x7465_6462_7974_6573,
        ];
        let round = |v: &mut [u64; 4]| {
            v[0] = v[0].wrapping_add(v[1]);
            v[1] = v[1].rotate_left(13) ^ v[0];
            v[0] = v[0].rotate_left(32);
            v[2] = v[2].wrapping_add(v[3]);
            v[3] = v[3].rotate_left(16) ^ v[2];
            v[0] = v[0].wrapping_add(v[3]);
            v[3] = v[3].rotate_left(21) ^ v[0];
            v[2] = v[2].wrapping_add(v[1]);
            v[1] = v[1].rotate_left(17) ^ v[2];
            v[2] = v[2].rotate_left(32);
        };
        // The message block, then the last block: the length (8) in the
        // top byte and no tail.
        for b in [m, 8 << 56] {
            v[3] ^= b;
            round(&mut v);
            v[0] ^= b;
        }
        v[2] ^= 0xff;
        for _ in 0..3 {
            round(&mut v);
        }
        v[0] ^ v[1] ^ v[2] ^ v[3]
    }

    #[test]
    fn a_random_state_limiter_hashes_with_siphash_1_3_under_a_key_of_its_own() {
        let sip = Sip::for_hasher::<RandomState>();
        for m in [0u64, 1, 7, 0x0706_0504_0302_0100, u64::MAX] {
            assert_eq!(sip.hash_one(&m), sip13_of_word(sip.k0, sip.k1, m), "{m:#x}");
        }
        // Another limiter, another key (one fixed key only in a build with
        // `PACE_FIXED_SIP=1`, for comparing builds).
        let other = Sip::for_hasher::<RandomState>();
        if cfg!(pace_fixed_sip) {
            assert_eq!((sip.k0, sip.k1), (Sip::FIXED.k0, Sip::FIXED.k1));
            assert_eq!((other.k0, other.k1), (Sip::FIXED.k0, Sip::FIXED.k1));
        } else {
            assert_ne!((sip.k0, sip.k1), (other.k0, other.k1));
            assert_ne!(sip.hash_one(&7u64), other.hash_one(&7u64));
        }
        // Only std's RandomState is replaced; other hashers are not called.
        assert!(sip_for::<RandomState>());
        assert!(!sip_for::<BuildHasherDefault<DefaultHasher>>());
        let unused = Sip::for_hasher::<BuildHasherDefault<DefaultHasher>>();
        assert_eq!((unused.k0, unused.k1), (0, 0));
    }
}
