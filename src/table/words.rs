//! Keys that fit in a word: which key types a cell's key half holds as
//! their own bits, and those bits. One type check per key type decides (`typeid`: the key type
//! need not be `'static`); a limiter of any other key type never builds a
//! [`WordKey`].

use std::any::TypeId;
use std::marker::PhantomData;
use std::net::Ipv4Addr;

use crate::IpPrefix;

/// A word-sized key type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    U8,
    U16,
    U32,
    U64,
    Usize,
    I8,
    I16,
    I32,
    I64,
    Isize,
    Char,
    Ipv4,
    IpPrefix,
}

impl Kind {
    #[inline(always)]
    fn of<T: ?Sized>() -> Option<Kind> {
        let id = typeid::of::<T>();
        let is = |other: TypeId| id == other;
        Some(if is(TypeId::of::<u64>()) {
            Kind::U64
        } else if is(TypeId::of::<u32>()) {
            Kind::U32
        } else if is(TypeId::of::<usize>()) {
            Kind::Usize
        } else if is(TypeId::of::<i64>()) {
            Kind::I64
        } else if is(TypeId::of::<i32>()) {
            Kind::I32
        } else if is(TypeId::of::<isize>()) {
            Kind::Isize
        } else if is(TypeId::of::<u16>()) {
            Kind::U16
        } else if is(TypeId::of::<i16>()) {
            Kind::I16
        } else if is(TypeId::of::<u8>()) {
            Kind::U8
        } else if is(TypeId::of::<i8>()) {
            Kind::I8
        } else if is(TypeId::of::<char>()) {
            Kind::Char
        } else if is(TypeId::of::<Ipv4Addr>()) {
            Kind::Ipv4
        } else if is(TypeId::of::<IpPrefix>()) {
            Kind::IpPrefix
        } else {
            return None;
        })
    }
}

/// Proof that `K` is one of the word-sized key types, with the conversions
/// between its values and their 64 bits (distinct values, distinct bits).
pub(crate) struct WordKey<K> {
    kind: Kind,
    _keys: PhantomData<fn() -> K>,
}

impl<K> Clone for WordKey<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for WordKey<K> {}

impl<K> std::fmt::Debug for WordKey<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WordKey({:?})", self.kind)
    }
}

impl<K> WordKey<K> {
    /// `Some` when `K` is `u8`…`u64`, `usize`, `i8`…`i64`, `isize`, `char`,
    /// `Ipv4Addr` or [`IpPrefix`].
    pub(crate) fn new() -> Option<WordKey<K>> {
        Kind::of::<K>().map(|kind| WordKey {
            kind,
            _keys: PhantomData,
        })
    }

    /// `K`'s kind, as [`new`](WordKey::new) found it: found again from the
    /// type ids, which the compiler folds to a constant for each `K`, so
    /// that a key's bits are read with the one load of its kind, not a jump
    /// on the stored kind.
    #[inline(always)]
    fn kind(&self) -> Kind {
        let kind = Kind::of::<K>();
        debug_assert_eq!(kind, Some(self.kind));
        kind.unwrap_or(self.kind)
    }

    /// The bits of `key`.
    #[inline]
    pub(crate) fn bits(&self, key: &K) -> u64 {
        // SAFETY: `self.kind` was found from `K`'s type id (`new`), so `K`
        // is the type `read` reads for that kind.
        unsafe { self.read((key as *const K).cast::<u8>()) }
    }

    /// The bits of a borrowed key when it is a `K` itself (by type id), or
    /// `None` for any other borrowed form.
    #[inline]
    pub(crate) fn bits_of<Q: ?Sized>(&self, key: &Q) -> Option<u64> {
        if typeid::of::<Q>() != typeid::of::<K>() {
            return None;
        }
        // SAFETY: `Q` is `K` (same type id, and `K`'s kind was found from its
        // type id), so the pointer points to a valid `K` of the kind `read`
        // reads; `Q` is sized, so dropping the pointer's metadata loses
        // nothing.
        Some(unsafe { self.read((key as *const Q).cast::<u8>()) })
    }

    /// # Safety
    /// `p` points to a valid value of the type of [`kind`](WordKey::kind)
    /// (`K`, the type of `self.kind` too).
    #[inline]
    unsafe fn read(&self, p: *const u8) -> u64 {
        // SAFETY: every arm: the caller's contract; each arm reads the type
        // of its kind, aligned as a reference to it was.
        unsafe {
            match self.kind() {
                Kind::U64 => *p.cast::<u64>(),
                Kind::U32 => u64::from(*p.cast::<u32>()),
                Kind::Usize => *p.cast::<usize>() as u64,
                Kind::I64 => *p.cast::<i64>() as u64,
                Kind::I32 => u64::from(*p.cast::<i32>() as u32),
                Kind::Isize => *p.cast::<isize>() as i64 as u64,
                Kind::U16 => u64::from(*p.cast::<u16>()),
                Kind::I16 => u64::from(*p.cast::<i16>() as u16),
                Kind::U8 => u64::from(*p),
                Kind::I8 => u64::from(*p.cast::<i8>() as u8),
                Kind::Char => u64::from(u32::from(*p.cast::<char>())),
                Kind::Ipv4 => u64::from((*p.cast::<Ipv4Addr>()).to_bits()),
                Kind::IpPrefix => (*p.cast::<IpPrefix>()).to_bits(),
            }
        }
    }

    /// The key whose bits are `bits` (bits made by [`bits`](WordKey::bits)).
    #[inline]
    pub(crate) fn key(&self, bits: u64) -> K {
        /// `v` as a `K`.
        ///
        /// # Safety
        /// `T` is `K`.
        #[inline(always)]
        unsafe fn cast<T, K>(v: T) -> K {
            debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<K>());
            let v = std::mem::ManuallyDrop::new(v);
            // SAFETY: the caller's contract: `T` and `K` are one type.
            unsafe { std::mem::transmute_copy::<T, K>(&*v) }
        }
        // SAFETY: every arm: `self.kind()` is found from `K`'s type id, so
        // `K` is the type each arm builds. Truncating casts undo `read`'s
        // widening.
        unsafe {
            match self.kind() {
                Kind::U64 => cast::<u64, K>(bits),
                Kind::U32 => cast::<u32, K>(bits as u32),
                Kind::Usize => cast::<usize, K>(bits as usize),
                Kind::I64 => cast::<i64, K>(bits as i64),
                Kind::I32 => cast::<i32, K>(bits as u32 as i32),
                Kind::Isize => cast::<isize, K>(bits as i64 as isize),
                Kind::U16 => cast::<u16, K>(bits as u16),
                Kind::I16 => cast::<i16, K>(bits as u16 as i16),
                Kind::U8 => cast::<u8, K>(bits as u8),
                Kind::I8 => cast::<i8, K>(bits as u8 as i8),
                Kind::Char => cast::<char, K>(char::from_u32(bits as u32).unwrap_or_default()),
                Kind::Ipv4 => cast::<Ipv4Addr, K>(Ipv4Addr::from_bits(bits as u32)),
                // `bits` came from `read`: a word `IpPrefix` made.
                Kind::IpPrefix => cast::<IpPrefix, K>(IpPrefix::from_bits(bits)),
            }
        }
    }
}

/// A word-sized key given as a borrowed form `Q` other than `K` itself (a
/// caller's `Borrow` impl): its rows are those whose key equals it.
pub(crate) struct Borrowed<'a, K, Q: ?Sized> {
    pub(crate) word: WordKey<K>,
    pub(crate) key: &'a Q,
}

impl<K, Q> super::Probe for Borrowed<'_, K, Q>
where
    K: std::borrow::Borrow<Q>,
    Q: ?Sized + Eq,
{
    #[inline]
    unsafe fn matches(&self, bits: u64) -> bool {
        self.word.key(bits).borrow() == self.key
    }

    /// Not without a `K`: a new row's bits come from [`make`](super::keys::NewRow::make).
    #[inline]
    fn word(&self) -> Option<u64> {
        None
    }
}

impl<K, Q> super::keys::NewRow for Borrowed<'_, K, Q>
where
    K: std::borrow::Borrow<Q>,
    Q: ?Sized + Eq + ToOwned<Owned = K>,
{
    fn make(&self) -> u64 {
        self.word.bits(&self.key.to_owned())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn round_trip<K: Copy + PartialEq + std::fmt::Debug + 'static>(values: &[K]) {
        let w = WordKey::<K>::new().expect("a word-sized key type");
        let mut seen = std::collections::HashSet::new();
        for v in values {
            let b = w.bits(v);
            assert_eq!(w.bits_of(v), Some(b));
            assert_eq!(w.key(b), *v, "bits {b:#x}");
            assert!(seen.insert(b), "two values with bits {b:#x}");
        }
    }

    #[test]
    fn every_word_type_round_trips_with_distinct_bits() {
        round_trip(&[0u64, 1, u64::MAX, 1 << 63]);
        round_trip(&[0u32, 7, u32::MAX]);
        round_trip(&[0usize, 3, usize::MAX]);
        round_trip(&[0i64, -1, i64::MIN, i64::MAX]);
        round_trip(&[0i32, -1, i32::MIN, i32::MAX]);
        round_trip(&[0isize, -1, isize::MIN, isize::MAX]);
        round_trip(&[0u16, u16::MAX]);
        round_trip(&[0i16, -1, i16::MIN]);
        round_trip(&[0u8, 255]);
        round_trip(&[0i8, -1, i8::MIN]);
        round_trip(&['a', '\0', char::MAX, 'é']);
        round_trip(&[
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::BROADCAST,
            Ipv4Addr::UNSPECIFIED,
        ]);
        round_trip(&[
            IpPrefix::v4(Ipv4Addr::UNSPECIFIED, 32),
            IpPrefix::v4(Ipv4Addr::UNSPECIFIED, 0),
            IpPrefix::v4(Ipv4Addr::BROADCAST, 24),
            IpPrefix::v6(std::net::Ipv6Addr::UNSPECIFIED, 0).unwrap(),
            IpPrefix::v6(std::net::Ipv6Addr::UNSPECIFIED, 62).unwrap(),
            IpPrefix::v6("2001:db8:1:200::".parse().unwrap(), 56).unwrap(),
            IpPrefix::v6(std::net::Ipv6Addr::from_bits(u128::MAX), 62).unwrap(),
        ]);
    }

    #[test]
    fn other_types_and_borrowed_forms_have_no_bits() {
        assert!(WordKey::<String>::new().is_none());
        assert!(WordKey::<u128>::new().is_none());
        assert!(WordKey::<std::net::IpAddr>::new().is_none());
        assert!(WordKey::<&'static u64>::new().is_none());
        let w = WordKey::<u64>::new().unwrap();
        assert_eq!(w.bits_of(&5u32), None);
        assert_eq!(w.bits_of("5"), None);
        assert_eq!(w.bits_of(&5u64), Some(5));
    }
}
