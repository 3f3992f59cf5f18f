//! Key extractors: where a request's key comes from.

use std::hash::Hash;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Uri};
use ipnet::IpNet;
use pace::IpPrefix;

/// What a key extractor sees of a request: its head, never its body.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The header fields.
    pub headers: &'a HeaderMap,
    /// The extensions (where servers put the peer address).
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `req`.
    #[inline]
    pub fn of<B>(req: &'a http::Request<B>) -> RequestHead<'a> {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }
}

/// Takes a request's key for one limit. `None` means the request has no key
/// for it (see [`MissingKey`](crate::MissingKey)).
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key type (the limiter is a `Pace<Self::Key, ..>`).
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// The key of `req`, if it has one.
    fn extract(&self, req: &RequestHead<'_>) -> Option<Self::Key>;

    /// Whether the key comes from the peer address the server records
    /// ([`peer_addr`]). A request without one then means a server that was
    /// not set up to record it (with axum:
    /// `into_make_service_with_connect_info::<SocketAddr>()`), and the layer
    /// answers it as a configuration error rather than a missing key.
    /// Default false.
    fn needs_peer_addr(&self) -> bool {
        false
    }

    /// Where the key is read from, in words, for the body of the answer to
    /// a request without one (`MissingKey::Reject`): [`Header`] says
    /// ``the `x-api-key` header``. Default `None`: the body names the limit
    /// only.
    fn describe(&self) -> Option<String> {
        None
    }
}

/// The peer address a server recorded for a request: the
/// `ConnectInfo<SocketAddr>` extension axum sets with
/// `into_make_service_with_connect_info::<SocketAddr>()` (feature `axum`), a
/// plain `SocketAddr` extension, or a [`PeerAddr`] extension, looked up in
/// that order.
#[inline]
pub fn peer_addr(ext: &Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0);
    }
    if let Some(a) = ext.get::<SocketAddr>() {
        return Some(*a);
    }
    ext.get::<PeerAddr>().map(|p| p.0)
}

/// A request extension carrying the peer address, for servers other than
/// axum (a middleware or the accept loop inserts it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Masks `ip` to its network: IPv4 to `v4_prefix` bits, IPv6 to `v6_prefix`
/// bits (prefixes above the address width keep the full address). An
/// IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) counts as IPv4.
#[inline]
pub fn mask(ip: IpAddr, v4_prefix: u8, v6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let keep = v4_prefix.min(32) as u32;
            let m = if keep == 0 {
                0
            } else {
                u32::MAX << (32 - keep)
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return mask(IpAddr::V4(v4), v4_prefix, v6_prefix);
            }
            let bits = u128::from(v6);
            let keep = v6_prefix.min(128) as u32;
            #[cfg(pace_mutant = "v6_full_address")]
            let keep = 128;
            let m = if keep == 0 {
                0
            } else {
                u128::MAX << (128 - keep)
            };
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

/// The default IPv6 prefix: /56, what an ISP commonly delegates to one
/// customer (per-address IPv6 keys rotate for free within it).
pub const DEFAULT_V6_PREFIX: u8 = 56;

/// The key a peer-address extractor ([`PeerIp`], [`ForwardedIp`]) gives:
/// the address masked to its network. Two are provided:
///
/// * [`IpPrefix`] (the default): the network in one word, which a `Pace`
///   holds in its rows' cells as its own bits (no allocation per row, no
///   pointer to follow per call). It keeps IPv6 prefixes up to /62
///   ([`IpPrefix::MAX_V6_LEN`]): a longer configured prefix keys by the /62
///   (four /64s share a row: fewer admissions, never more).
/// * `IpAddr`: the masked address, any prefix up to /128, boxed in the
///   limiter's rows as every key that is not word-sized.
///
/// Both count an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as IPv4 (see
/// [`mask`]).
pub trait PeerKey: Hash + Eq + Clone + Send + Sync + 'static {
    /// The key of `ip` masked to `v4_prefix` bits (IPv4) or `v6_prefix` bits
    /// (IPv6).
    fn masked(ip: IpAddr, v4_prefix: u8, v6_prefix: u8) -> Self;
}

impl PeerKey for IpAddr {
    #[inline]
    fn masked(ip: IpAddr, v4_prefix: u8, v6_prefix: u8) -> IpAddr {
        match ip {
            // A whole IPv4 address (the default): nothing to mask.
            IpAddr::V4(v4) if v4_prefix >= 32 => IpAddr::V4(v4),
            ip => mask(ip, v4_prefix, v6_prefix),
        }
    }
}

impl PeerKey for IpPrefix {
    #[inline]
    fn masked(ip: IpAddr, v4_prefix: u8, v6_prefix: u8) -> IpPrefix {
        let v6 = match ip {
            IpAddr::V4(v4) => return IpPrefix::v4(v4, v4_prefix),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => return IpPrefix::v4(v4, v4_prefix),
                None => v6,
            },
        };
        let keep = v6_prefix.min(IpPrefix::MAX_V6_LEN);
        #[cfg(pace_mutant = "v6_full_address")]
        let keep = IpPrefix::MAX_V6_LEN;
        IpPrefix::v6(v6, keep).expect("a prefix of at most MAX_V6_LEN fits")
    }
}

/// Keys by the peer address (see [`peer_addr`]), IPv6 masked to a prefix
/// (default /56), IPv4 the full address (default /32), as the key type `K`
/// of the limiter it keys ([`PeerKey`]: an [`IpPrefix`], one word per row,
/// by default; an `IpAddr` for IPv6 prefixes longer than /62).
///
/// ```
/// use std::{net::IpAddr, sync::Arc};
/// use pace::{IpPrefix, Pace, Rate};
/// use pace_tower::{Limit, PeerIp};
///
/// let per_net: Arc<Pace<IpPrefix>> = Arc::new(Pace::new(Rate::per_second(100)?));
/// let by_net = Limit::new("source", per_net, PeerIp::new()); // IPv6 /56
/// // Every IPv6 address on its own (/128 does not fit in a word: boxed).
/// let per_addr: Arc<Pace<IpAddr>> = Arc::new(Pace::new(Rate::per_second(100)?));
/// let by_addr = Limit::new("address", per_addr, PeerIp::new().v6_prefix(128));
/// # Ok::<(), pace::ConfigError>(())
/// ```
#[doc(alias = "PeerIpKeyExtractor")]
pub struct PeerIp<K = IpPrefix> {
    v4_prefix: u8,
    v6_prefix: u8,
    _key: PhantomData<fn() -> K>,
}

impl<K> Clone for PeerIp<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for PeerIp<K> {}

impl<K> std::fmt::Debug for PeerIp<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerIp")
            .field("v4_prefix", &self.v4_prefix)
            .field("v6_prefix", &self.v6_prefix)
            .field("key", &std::any::type_name::<K>())
            .finish()
    }
}

impl<K> Default for PeerIp<K> {
    fn default() -> Self {
        PeerIp {
            v4_prefix: 32,
            v6_prefix: DEFAULT_V6_PREFIX,
            _key: PhantomData,
        }
    }
}

impl<K> PeerIp<K> {
    /// IPv6 /56, IPv4 /32.
    pub fn new() -> Self {
        Self::default()
    }

    /// The IPv6 prefix length kept: 0..=128 for `IpAddr` keys (larger keeps
    /// all 128 bits), 0..=62 for [`IpPrefix`] keys (larger keeps 62 bits,
    /// see [`PeerKey`]).
    pub fn v6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits;
        self
    }

    /// The IPv4 prefix length kept (0..=32; larger keeps all 32 bits).
    pub fn v4_prefix(mut self, bits: u8) -> Self {
        self.v4_prefix = bits;
        self
    }

    /// The key of `ip`, masked.
    #[inline]
    fn key_of(&self, ip: IpAddr) -> K
    where
        K: PeerKey,
    {
        K::masked(ip, self.v4_prefix, self.v6_prefix)
    }
}

impl<K: PeerKey> KeyExtractor for PeerIp<K> {
    type Key = K;

    #[inline(always)]
    fn extract(&self, req: &RequestHead<'_>) -> Option<K> {
        Some(self.key_of(peer_addr(req.extensions)?.ip()))
    }

    fn needs_peer_addr(&self) -> bool {
        true
    }
}

/// Which forwarding header a [`ForwardedIp`] reads. Only one: a proxy sets
/// one of them, and the other arrives as the client wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// Keys by the client address that trusted proxies forwarded: when the peer
/// is in one of the configured proxy networks, the forwarding header's hops
/// are walked from the right (nearest first), skipping hops that are
/// themselves trusted proxies; the first untrusted hop is the client. Hops
/// further left were written by that client and are ignored, so a spoofed
/// leftmost entry changes nothing. A peer outside the proxy networks is the
/// client itself, whatever the header says. The address is then masked as
/// in [`PeerIp`].
///
/// A request whose walk meets a hop that is not an address (`unknown`, an
/// obfuscated identifier, garbage) before an untrusted address has no key.
/// When every hop is a trusted proxy, the leftmost hop is the key.
///
/// Its key type `K` is that of [`PeerIp`]: an [`IpPrefix`] by default.
#[doc(alias = "SmartIpKeyExtractor")]
pub struct ForwardedIp<K = IpPrefix> {
    trusted: Vec<IpNet>,
    header: ForwardHeader,
    peer: PeerIp<K>,
}

impl<K> Clone for ForwardedIp<K> {
    fn clone(&self) -> Self {
        ForwardedIp {
            trusted: self.trusted.clone(),
            header: self.header,
            peer: self.peer,
        }
    }
}

impl<K> std::fmt::Debug for ForwardedIp<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardedIp")
            .field("trusted", &self.trusted)
            .field("header", &self.header)
            .field("peer", &self.peer)
            .finish()
    }
}

impl<K> ForwardedIp<K> {
    /// Trusts the proxies in `networks` and reads `X-Forwarded-For`.
    pub fn new(networks: impl IntoIterator<Item = IpNet>) -> Self {
        ForwardedIp {
            trusted: networks.into_iter().collect(),
            header: ForwardHeader::XForwardedFor,
            peer: PeerIp::default(),
        }
    }

    /// Reads `header` instead.
    pub fn header(mut self, header: ForwardHeader) -> Self {
        self.header = header;
        self
    }

    /// The IPv6 prefix length kept (default /56; as
    /// [`PeerIp::v6_prefix`]).
    pub fn v6_prefix(mut self, bits: u8) -> Self {
        self.peer = self.peer.v6_prefix(bits);
        self
    }

    /// The IPv4 prefix length kept (default /32).
    pub fn v4_prefix(mut self, bits: u8) -> Self {
        self.peer = self.peer.v4_prefix(bits);
        self
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// The client address, unmasked.
    pub fn client(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        let peer = peer_addr(req.extensions)?.ip();
        if !self.trusts(peer) {
            return Some(peer);
        }
        let mut hops: Vec<&str> = Vec::new();
        let name = match self.header {
            ForwardHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardHeader::Forwarded => http::header::FORWARDED,
        };
        for value in req.headers.get_all(name) {
            let s = value.to_str().ok()?;
            hops.extend(s.split(',').map(str::trim));
        }
        let mut last = None;
        #[cfg(pace_mutant = "xff_leftmost")]
        hops.reverse();
        for hop in hops.iter().rev() {
            let ip = match self.header {
                ForwardHeader::XForwardedFor => parse_hop(hop)?,
                ForwardHeader::Forwarded => parse_forwarded_for(hop)?,
            };
            if !self.trusts(ip) {
                return Some(ip);
            }
            last = Some(ip);
        }
        // No header, or every hop is a trusted proxy.
        Some(last.unwrap_or(peer))
    }
}

impl<K: PeerKey> KeyExtractor for ForwardedIp<K> {
    type Key = K;

    fn extract(&self, req: &RequestHead<'_>) -> Option<K> {
        self.client(req).map(|ip| self.peer.key_of(ip))
    }

    fn needs_peer_addr(&self) -> bool {
        true
    }
}

/// One address: `a.b.c.d`, `a.b.c.d:port`, `v6`, `[v6]` or `[v6]:port`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = hop.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    let inner = hop.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// The `for=` parameter of one `Forwarded` element.
fn parse_forwarded_for(element: &str) -> Option<IpAddr> {
    for pair in element.split(';') {
        let (k, v) = pair.trim().split_once('=')?;
        if k.trim().eq_ignore_ascii_case("for") {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            return parse_hop(v);
        }
    }
    None
}

/// Keys by the value of one header field (the first, when repeated).
#[derive(Clone, Debug)]
pub struct Header(pub HeaderName);

impl KeyExtractor for Header {
    type Key = HeaderValue;

    #[inline]
    fn extract(&self, req: &RequestHead<'_>) -> Option<HeaderValue> {
        req.headers.get(&self.0).cloned()
    }

    fn describe(&self) -> Option<String> {
        Some(format!("the `{}` header", self.0))
    }
}

/// Keys by a closure (see [`from_fn`]).
#[derive(Clone)]
pub struct FromFn<F>(F);

/// A key extractor from a closure.
pub fn from_fn<F, K>(f: F) -> FromFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    FromFn(f)
}

impl<F, K> KeyExtractor for FromFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Key = K;

    #[inline]
    fn extract(&self, req: &RequestHead<'_>) -> Option<K> {
        (self.0)(req)
    }
}

impl<F> std::fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FromFn")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        let v6: IpAddr = "2001:db8:1:2ff:aaaa::1".parse().unwrap();
        assert_eq!(
            mask(v6, 32, 56),
            "2001:db8:1:200::".parse::<IpAddr>().unwrap()
        );
        assert_eq!(mask(v6, 32, 200), v6);
        let v4: IpAddr = "192.0.2.77".parse().unwrap();
        assert_eq!(mask(v4, 32, 56), v4);
        assert_eq!(mask(v4, 24, 56), "192.0.2.0".parse::<IpAddr>().unwrap());
        assert_eq!(mask(v4, 0, 56), "0.0.0.0".parse::<IpAddr>().unwrap());
        let mapped: IpAddr = "::ffff:192.0.2.77".parse().unwrap();
        assert_eq!(mask(mapped, 32, 56), v4);
    }

    /// The networks an `IpPrefix` key and an `IpAddr` key name agree: same
    /// family, same masked address (`mask`'s), and the prefix's length.
    #[test]
    fn prefix_keys_name_the_networks_address_keys_do() {
        let addrs: [IpAddr; 8] = [
            "192.0.2.77".parse().unwrap(),
            "0.0.0.0".parse().unwrap(),
            "255.255.255.255".parse().unwrap(),
            "::ffff:192.0.2.77".parse().unwrap(),
            "2001:db8:1:2ff:aaaa::1".parse().unwrap(),
            "::".parse().unwrap(),
            "::1".parse().unwrap(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
        ];
        for ip in addrs {
            for v4 in [0, 1, 8, 24, 31, 32, 33, 255] {
                for v6 in [0, 1, 32, 48, 56, 61, 62] {
                    let p = IpPrefix::masked(ip, v4, v6);
                    let a = <IpAddr as PeerKey>::masked(ip, v4, v6);
                    assert_eq!(p.addr(), a, "{ip} /{v4} /{v6}");
                    assert_eq!(a, mask(ip, v4, v6), "{ip} /{v4} /{v6}");
                    let len = if a.is_ipv4() { v4.min(32) } else { v6 };
                    assert_eq!(p.prefix_len(), len, "{ip} /{v4} /{v6}");
                }
            }
        }
        // An IPv4-mapped address is its IPv4 address's key.
        let mapped: IpAddr = "::ffff:192.0.2.77".parse().unwrap();
        let v4: IpAddr = "192.0.2.77".parse().unwrap();
        assert_eq!(
            IpPrefix::masked(mapped, 32, 56),
            IpPrefix::masked(v4, 32, 56)
        );
        assert!(IpPrefix::masked(mapped, 32, 56).is_ipv4());
        // IPv4 and IPv6 never share a key, whatever the lengths.
        assert_ne!(
            IpPrefix::masked("0.0.0.0".parse().unwrap(), 32, 62),
            IpPrefix::masked("::".parse().unwrap(), 32, 62)
        );
    }

    /// Above /62 an `IpPrefix` key keeps 62 bits (an `IpAddr` key keeps the
    /// prefix asked for).
    #[test]
    fn prefix_keys_keep_at_most_62_bits_of_ipv6() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:3:bbbb::2".parse().unwrap(); // same /62
        let c: IpAddr = "2001:db8:1:4::".parse().unwrap(); // the next /62
        for v6 in [63, 64, 96, 128, 255] {
            let (pa, pb, pc) = (
                IpPrefix::masked(a, 32, v6),
                IpPrefix::masked(b, 32, v6),
                IpPrefix::masked(c, 32, v6),
            );
            assert_eq!(pa, pb, "/{v6}");
            assert_ne!(pa, pc, "/{v6}");
            assert_eq!(pa.prefix_len(), 62);
            assert_eq!(pa.addr(), "2001:db8:1::".parse::<IpAddr>().unwrap());
            // (a and b differ in their 63rd and 64th bits.)
            assert_eq!(
                <IpAddr as PeerKey>::masked(a, 32, v6) == <IpAddr as PeerKey>::masked(b, 32, v6),
                v6 < 64
            );
        }
    }

    /// `ForwardedIp` masks the client it finds as `PeerIp` does, into
    /// either key type.
    #[test]
    fn forwarded_clients_are_masked_into_either_key() {
        let req = |peer: &str, xff: &str| {
            let mut r = http::Request::builder()
                .header("x-forwarded-for", xff)
                .body(())
                .unwrap();
            r.extensions_mut()
                .insert(PeerAddr(SocketAddr::new(peer.parse().unwrap(), 1)));
            r
        };
        let trusted = || ["10.0.0.0/8".parse::<IpNet>().unwrap()];
        let r = req("10.0.0.1", "2001:db8:1:2ff::9, 10.0.0.2");
        let head = RequestHead::of(&r);
        let p: IpPrefix = ForwardedIp::new(trusted()).extract(&head).unwrap();
        assert_eq!(p.to_string(), "2001:db8:1:200::/56");
        let a: IpAddr = ForwardedIp::new(trusted()).extract(&head).unwrap();
        assert_eq!(a, "2001:db8:1:200::".parse::<IpAddr>().unwrap());
        let r = req("10.0.0.1", "::ffff:192.0.2.9");
        let head = RequestHead::of(&r);
        let p: IpPrefix = ForwardedIp::new(trusted())
            .v4_prefix(24)
            .extract(&head)
            .unwrap();
        assert_eq!(p.to_string(), "192.0.2.0/24");
        // An untrusted peer is the client; PeerIp agrees.
        let r = req("192.0.2.77", "198.51.100.1");
        let head = RequestHead::of(&r);
        let f: IpPrefix = ForwardedIp::new(trusted()).extract(&head).unwrap();
        let p: IpPrefix = PeerIp::new().extract(&head).unwrap();
        assert_eq!(
            (f, p),
            (IpPrefix::from(std::net::Ipv4Addr::new(192, 0, 2, 77)), f)
        );
    }

    #[test]
    fn hops() {
        assert_eq!(parse_hop("192.0.2.1:80"), Some([192, 0, 2, 1].into()));
        assert_eq!(
            parse_hop("[2001:db8::1]:443"),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(
            parse_hop("[2001:db8::1]"),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(parse_hop("unknown"), None);
        assert_eq!(
            parse_forwarded_for("for=\"[2001:db8:cafe::17]:4711\";proto=https"),
            Some("2001:db8:cafe::17".parse().unwrap())
        );
        assert_eq!(
            parse_forwarded_for("proto=http;For=192.0.2.60"),
            Some([192, 0, 2, 60].into())
        );
        assert_eq!(parse_forwarded_for("for=unknown"), None);
        assert_eq!(parse_forwarded_for("proto=http"), None);
    }
}
