//! Reading a body under a byte share: [`BytePermit::read_body`] and the
//! [`Body`] that keeps the share attached to its buffer.

use std::fmt;
use std::io::{self, Read};
use std::ops::Deref;

use super::{BodyError, BytePermit};

/// First read size when the share is larger; the buffer then doubles, never
/// past the share.
const FIRST_CHUNK: usize = 8 * 1024;

impl BytePermit {
    /// Read a whole body under this share. The cap is enforced while
    /// reading: the buffer never grows past the share, and the first byte
    /// beyond it ends the read with [`BodyError::TooLong`]. On success the
    /// share shrinks to the buffer's real size and moves into the returned
    /// [`Body`], which releases it when dropped.
    ///
    /// # Errors
    /// [`BodyError::TooLong`] past the share, [`BodyError::Io`] when the
    /// reader fails. Either way the share is released.
    pub fn read_body<R: Read>(mut self, mut reader: R) -> Result<Body, BodyError> {
        let share = self.0.bytes;
        let limit = usize::try_from(share).unwrap_or(usize::MAX);
        let mut buf: Vec<u8> = Vec::new();
        let mut filled = 0usize;
        loop {
            if filled == buf.len() {
                if filled == limit {
                    if has_more(&mut reader)? {
                        return Err(BodyError::TooLong { limit: share });
                    }
                    break;
                }
                let grow = filled.max(FIRST_CHUNK).min(limit - filled);
                buf.try_reserve_exact(grow)
                    .map_err(|e| BodyError::Io(io::Error::new(io::ErrorKind::OutOfMemory, e)))?;
                buf.resize(filled + grow, 0);
            }
            let room = buf.len() - filled;
            let dst = buf.get_mut(filled..).unwrap_or_default();
            match reader.read(dst) {
                Ok(0) => break,
                Ok(n) => filled += n.min(room),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(BodyError::Io(e)),
            }
        }
        buf.truncate(filled);
        buf.shrink_to_fit();
        // Charge what the buffer really holds: its capacity, which after
        // `shrink_to_fit` is its length, and which never exceeds the share.
        let charged = (buf.capacity() as u64).clamp(filled as u64, share);
        let _ = self.shrink_to(charged);
        Ok(Body { buf, permit: self })
    }
}

fn has_more<R: Read>(reader: &mut R) -> Result<bool, BodyError> {
    let mut probe = [0u8; 1];
    loop {
        match reader.read(&mut probe) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(BodyError::Io(e)),
        }
    }
}

/// A body read under a byte share. The share is attached to the buffer:
/// dropping the body releases it. With the `bytes` feature,
/// `Body::into_bytes` moves both into a `bytes::Bytes` owner.
pub struct Body {
    buf: Vec<u8>,
    permit: BytePermit,
}

impl Body {
    /// Bytes counted against the gate for this buffer.
    pub fn charged(&self) -> u64 {
        self.permit.0.bytes
    }

    /// The buffer and its byte share, for callers that keep them together
    /// some other way. Drop the permit only after the last use of the
    /// buffer (or of anything borrowing from it).
    pub fn into_parts(self) -> (Vec<u8>, BytePermit) {
        (self.buf, self.permit)
    }

    /// Make it a `Bytes` whose owner holds the byte share: clones and slices
    /// share the owner, so the share is released only when the last of them
    /// is dropped. A short slice of a large body keeps the whole body counted,
    /// which is the truth: it keeps the whole buffer alive.
    #[cfg(feature = "bytes")]
    #[cfg_attr(docsrs, doc(cfg(feature = "bytes")))]
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl AsRef<[u8]> for Body {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Body")
            .field("len", &self.buf.len())
            .field("charged", &self.permit.0.bytes)
            .finish()
    }
}
