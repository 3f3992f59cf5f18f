//! [`IpPrefix`]: an IP network (an address masked to a prefix length) in
//! one word, a key whose rows hold it as its own bits.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IP network: an address masked to its first `prefix_len` bits, IPv4 up
/// to /32, IPv6 up to /62 ([`MAX_V6_LEN`](IpPrefix::MAX_V6_LEN)). A key
/// for limits per source network (pace-tower's `PeerIp` keys a
/// `Pace<IpPrefix>` so): it is one word, so with the default hashers a
/// limiter's rows hold it as their own bits rather than boxed (DESIGN.md
/// §2).
///
/// Two prefixes are equal when they are the same network: same family,
/// same length, same masked address (`10.0.0.0/24` and `10.0.0.0/32`
/// differ, as do `0.0.0.0/0` and `::/0`). An IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) given to [`v6`](IpPrefix::v6) stays IPv6; map it with
/// `Ipv6Addr::to_ipv4_mapped` first to key it as IPv4.
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
/// use pace::IpPrefix;
///
/// let net = IpPrefix::v6("2001:db8:1:2ff::1".parse().unwrap(), 56).unwrap();
/// assert_eq!(net.addr(), "2001:db8:1:200::".parse::<IpAddr>().unwrap());
/// assert_eq!(net.prefix_len(), 56);
/// assert_eq!(net.to_string(), "2001:db8:1:200::/56");
/// // Longer IPv6 prefixes do not fit in the word: key a `Pace<IpAddr>`.
/// assert_eq!(IpPrefix::v6(Ipv6Addr::LOCALHOST, 64), None);
///
/// let host = IpPrefix::v4(Ipv4Addr::new(192, 0, 2, 7), 32);
/// assert_eq!(host, IpPrefix::from(Ipv4Addr::new(192, 0, 2, 7)));
/// assert_ne!(host, IpPrefix::v4(Ipv4Addr::new(192, 0, 2, 7), 24));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct IpPrefix(u64);

// The word: bit 63 is the family (1 for IPv6). Below it, the prefix's
// address bits, a 1 (the end marker) and zeros: IPv4 /L is
// `(masked address << 1) | 1 << (32 - L)` (bits 32..0, the rest 0), IPv6
// /L is `1 << 63 | (the address's first 64 bits, masked) >> 1 | 1 << (62 -
// L)`. The marker's place gives the length and the bits above it the
// address, so distinct networks have distinct words and every word made
// here decodes to the network it was made from.

/// The family bit.
const V6: u64 = 1 << 63;

impl IpPrefix {
    /// The longest IPv6 prefix that fits in the word: 62 bits (the family
    /// bit and the length's marker take the other two).
    pub const MAX_V6_LEN: u8 = 62;

    /// The network of `addr` at `prefix_len` bits (above 32: the whole
    /// address).
    #[inline]
    pub fn v4(addr: Ipv4Addr, prefix_len: u8) -> IpPrefix {
        let len = u32::from(prefix_len.min(32));
        let bits = u64::from(addr.to_bits() & mask32(len));
        IpPrefix(bits << 1 | 1 << (32 - len))
    }

    /// The network of `addr` at `prefix_len` bits; `None` above
    /// [`MAX_V6_LEN`](IpPrefix::MAX_V6_LEN), which does not fit in the word
    /// (a `Pace<IpAddr>` keys longer prefixes, boxed).
    #[inline]
    pub fn v6(addr: Ipv6Addr, prefix_len: u8) -> Option<IpPrefix> {
        if prefix_len > Self::MAX_V6_LEN {
            return None;
        }
        let len = u32::from(prefix_len);
        let high = (addr.to_bits() >> 64) as u64 & mask64(len);
        Some(IpPrefix(v6_word(high, len)))
    }

    /// The network's address (the address masked to the prefix).
    #[inline]
    pub fn addr(self) -> IpAddr {
        let len = u32::from(self.prefix_len());
        let marker = 1u64 << (if self.is_ipv6() { 62 } else { 32 } - len);
        let bits = self.0 & !V6 & !marker;
        if self.is_ipv6() {
            IpAddr::V6(Ipv6Addr::from_bits(u128::from(bits << 1) << 64))
        } else {
            IpAddr::V4(Ipv4Addr::from_bits((bits >> 1) as u32))
        }
    }

    /// The prefix length: 0..=32 for IPv4, 0..=62 for IPv6.
    #[inline]
    pub fn prefix_len(self) -> u8 {
        let tz = (self.0 & !V6).trailing_zeros() as u8;
        if self.is_ipv6() {
            62 - tz
        } else {
            32 - tz
        }
    }

    /// Whether it is an IPv4 network.
    #[inline]
    pub fn is_ipv4(self) -> bool {
        self.0 & V6 == 0
    }

    /// Whether it is an IPv6 network.
    #[inline]
    pub fn is_ipv6(self) -> bool {
        !self.is_ipv4()
    }

    /// The word (for the table: distinct networks, distinct words).
    #[inline]
    pub(crate) fn to_bits(self) -> u64 {
        self.0
    }

    /// The network whose word is `bits` (a word made by
    /// [`to_bits`](IpPrefix::to_bits)).
    #[inline]
    pub(crate) fn from_bits(bits: u64) -> IpPrefix {
        IpPrefix(bits)
    }
}

/// The first `len` (0..=32) bits of a `u32`.
#[inline]
fn mask32(len: u32) -> u32 {
    u32::MAX.checked_shl(32 - len).unwrap_or(0)
}

/// The first `len` (0..=64) bits of a `u64`.
#[inline]
fn mask64(len: u32) -> u64 {
    u64::MAX.checked_shl(64 - len).unwrap_or(0)
}

/// The word of the IPv6 network whose first 64 bits, masked to `len`
/// (0..=62), are `high`.
#[cfg(not(pace_mutant = "ip_prefix_untagged"))]
#[inline]
fn v6_word(high: u64, len: u32) -> u64 {
    V6 | high >> 1 | 1 << (62 - len)
}

/// Known-wrong variant `ip_prefix_untagged`: IPv6 words lack the family
/// bit, so a long IPv6 prefix of zeros shares an IPv4 network's word.
#[cfg(pace_mutant = "ip_prefix_untagged")]
#[inline]
fn v6_word(high: u64, len: u32) -> u64 {
    high >> 1 | 1 << (62 - len)
}

impl From<Ipv4Addr> for IpPrefix {
    /// The address as a /32.
    fn from(addr: Ipv4Addr) -> IpPrefix {
        IpPrefix::v4(addr, 32)
    }
}

impl fmt::Display for IpPrefix {
    /// `addr/len`, as `192.0.2.0/24` or `2001:db8::/56`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix_len())
    }
}

impl fmt::Debug for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpPrefix({self})")
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The network by a model of our own: the address masked with `u128`
    /// arithmetic (no words).
    fn model(ip: IpAddr, len: u8) -> (IpAddr, u8) {
        match ip {
            IpAddr::V4(a) => {
                let len = len.min(32);
                let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                (IpAddr::V4(Ipv4Addr::from_bits(a.to_bits() & m)), len)
            }
            IpAddr::V6(a) => {
                let m = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(len))
                };
                (IpAddr::V6(Ipv6Addr::from_bits(a.to_bits() & m)), len)
            }
        }
    }

    fn of(ip: IpAddr, len: u8) -> Option<IpPrefix> {
        match ip {
            IpAddr::V4(a) => Some(IpPrefix::v4(a, len)),
            IpAddr::V6(a) => IpPrefix::v6(a, len),
        }
    }

    /// Every word seen so far, with the network it was made from: one
    /// network per word, one word per network.
    #[derive(Default)]
    struct Words {
        nets: HashMap<u64, (IpAddr, u8)>,
        words: HashMap<(IpAddr, u8), u64>,
    }

    impl Words {
        /// Records the network of `ip/len` and its word: distinct networks
        /// must have distinct words (checked before anything decodes).
        fn add(&mut self, ip: IpAddr, len: u8) {
            let p = of(ip, len).expect("fits");
            let net = model(ip, len);
            if let Some(other) = self.nets.insert(p.to_bits(), net) {
                assert_eq!(other, net, "{:?} and {net:?} share a word", other);
            }
            if let Some(w) = self.words.insert(net, p.to_bits()) {
                assert_eq!(w, p.to_bits(), "{net:?} has two words");
            }
        }

        /// Every word seen decodes to its network.
        fn decode_all(&self) {
            for (&word, &net) in &self.nets {
                let p = IpPrefix::from_bits(word);
                assert_eq!((p.addr(), p.prefix_len()), net, "{word:#x}");
                assert_eq!(p.is_ipv4(), net.0.is_ipv4(), "{word:#x}");
                assert_eq!(p.to_string(), format!("{}/{}", net.0, net.1));
                assert_eq!(of(net.0, net.1), Some(p), "{word:#x}");
            }
        }
    }

    const V4: [Ipv4Addr; 6] = [
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(192, 0, 2, 255),
        Ipv4Addr::new(128, 0, 0, 0),
        Ipv4Addr::new(0, 0, 0, 1),
    ];

    fn v6s() -> Vec<Ipv6Addr> {
        vec![
            Ipv6Addr::UNSPECIFIED,
            Ipv6Addr::LOCALHOST,
            Ipv6Addr::from_bits(u128::MAX),
            "2001:db8:1:2ff:aaaa::1".parse().unwrap(),
            "::ffff:192.0.2.7".parse().unwrap(),
            "::1:0:0:0".parse().unwrap(),
            "8000::".parse().unwrap(),
            "0:0:0:4::".parse().unwrap(),
            Ipv6Addr::from_bits(1 << 66),
        ]
    }

    // Safe code only (the table's reading of the word is tested under Miri
    // by `words`' round trip): thousands of networks would take Miri long.
    #[cfg_attr(miri, ignore)]
    #[test]
    fn every_length_of_every_family_has_its_own_word() {
        let mut w = Words::default();
        for len in 0..=32 {
            for a in V4 {
                w.add(IpAddr::V4(a), len);
            }
        }
        for len in 0..=IpPrefix::MAX_V6_LEN {
            for a in v6s() {
                w.add(IpAddr::V6(a), len);
            }
        }
        // The single-bit networks: every bit of every length.
        for len in 1..=32u8 {
            for bit in 0..len {
                w.add(IpAddr::V4(Ipv4Addr::from_bits(1 << (31 - bit))), len);
            }
        }
        for len in 1..=IpPrefix::MAX_V6_LEN {
            for bit in 0..len {
                w.add(
                    IpAddr::V6(Ipv6Addr::from_bits(1 << (127 - u32::from(bit)))),
                    len,
                );
            }
        }
        w.decode_all();
        // 0.0.0.0/32 and ::/62 both end in the marker alone.
        assert_ne!(
            IpPrefix::v4(Ipv4Addr::UNSPECIFIED, 32),
            IpPrefix::v6(Ipv6Addr::UNSPECIFIED, 62).unwrap(),
            "IPv4 and IPv6 share a word"
        );
        assert_ne!(
            IpPrefix::v4(Ipv4Addr::UNSPECIFIED, 0),
            IpPrefix::v6(Ipv6Addr::UNSPECIFIED, 0).unwrap()
        );
    }

    #[test]
    fn lengths_past_the_word() {
        for a in V4 {
            assert_eq!(IpPrefix::v4(a, 33), IpPrefix::v4(a, 32));
            assert_eq!(IpPrefix::v4(a, 255), IpPrefix::from(a));
        }
        for a in v6s() {
            assert!(IpPrefix::v6(a, 62).is_some());
            for len in 63..=255 {
                assert_eq!(IpPrefix::v6(a, len), None, "{a}/{len}");
            }
        }
    }

    #[test]
    fn masking_drops_the_bits_past_the_prefix() {
        let a = IpPrefix::v6("2001:db8:1:2ff:aaaa::1".parse().unwrap(), 56).unwrap();
        let b = IpPrefix::v6("2001:db8:1:200::".parse().unwrap(), 56).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "2001:db8:1:200::/56");
        assert_eq!(format!("{a:?}"), "IpPrefix(2001:db8:1:200::/56)");
        let c = IpPrefix::v6("2001:db8:1:300::".parse().unwrap(), 56).unwrap();
        assert_ne!(a, c);
        assert_eq!(
            IpPrefix::v4(Ipv4Addr::new(192, 0, 2, 77), 24).to_string(),
            "192.0.2.0/24"
        );
        assert!(IpPrefix::v4(Ipv4Addr::BROADCAST, 0).is_ipv4());
        assert!(IpPrefix::v6(Ipv6Addr::LOCALHOST, 0).unwrap().is_ipv6());
    }

    fn any_net() -> impl Strategy<Value = (IpAddr, u8)> {
        prop_oneof![
            (any::<u32>(), 0..=40u8).prop_map(|(a, l)| (IpAddr::V4(Ipv4Addr::from_bits(a)), l)),
            (any::<u128>(), 0..=IpPrefix::MAX_V6_LEN)
                .prop_map(|(a, l)| (IpAddr::V6(Ipv6Addr::from_bits(a)), l)),
            // Few distinct high bits, so that equal networks come up.
            (0..4u128, 0..4u128, 0..=IpPrefix::MAX_V6_LEN).prop_map(|(h, l, len)| {
                let a = h << 126 | l << 64 | 0xdead;
                (IpAddr::V6(Ipv6Addr::from_bits(a)), len)
            }),
            (0..4u32, 0..=32u8)
                .prop_map(|(h, l)| (IpAddr::V4(Ipv4Addr::from_bits(h << 30 | 7)), l)),
        ]
    }

    proptest! {
        #[cfg_attr(miri, ignore)] // proptest reads the working directory
        #[test]
        fn words_are_equal_exactly_when_networks_are(a in any_net(), b in any_net()) {
            let (pa, pb) = (of(a.0, a.1).unwrap(), of(b.0, b.1).unwrap());
            let same = model(a.0, a.1) == model(b.0, b.1);
            prop_assert_eq!(pa.to_bits() == pb.to_bits(), same, "share a word: {:?} {:?}", a, b);
            prop_assert_eq!(pa == pb, same);
            prop_assert_eq!((pa.addr(), pa.prefix_len()), model(a.0, a.1));
        }
    }
}
