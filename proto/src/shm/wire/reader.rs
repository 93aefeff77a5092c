//! Reading a control record's fields: every length checked against what is left before it is
//! used; byte fields become slices of the record's own memory where it has one.

use bytes::Bytes;

use super::{Body, DecodeError, Part, Returned, Shared};

pub(super) struct Reader<'a> {
    pub(super) rest: &'a [u8],
    pub(super) whole: &'a [u8],
    /// The memory `whole` lives in, if it has its own: byte fields become slices of it.
    pub(super) owner: Option<&'a Bytes>,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.rest.len() {
            return Err(DecodeError("a field runs past the end"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }
    /// A length-prefixed byte field as `Bytes`: a slice of the owner, or a copy.
    pub(super) fn owned_bytes(&mut self) -> Result<Bytes, DecodeError> {
        let bytes = self.bytes()?;
        Ok(match self.owner {
            Some(owner) => {
                let start = self.whole.len() - self.rest.len() - bytes.len();
                owner.slice(start..start + bytes.len())
            }
            None => Bytes::copy_from_slice(bytes),
        })
    }
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A list count whose items take at least `item` bytes each: checked against what is left
    /// before anything is allocated.
    pub(super) fn count(&mut self, item: usize) -> Result<usize, DecodeError> {
        let count = usize::try_from(self.u32()?).map_err(|_| DecodeError("count too large"))?;
        if count.saturating_mul(item) > self.rest.len() {
            return Err(DecodeError("a list runs past the end"));
        }
        Ok(count)
    }
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.u32()?).map_err(|_| DecodeError("length too large"))?;
        self.take(len)
    }
    pub(super) fn str(&mut self) -> Result<String, DecodeError> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_owned)
            .map_err(|_| DecodeError("a string is not UTF-8"))
    }
    pub(super) fn shared(&mut self) -> Result<Shared, DecodeError> {
        Ok(Shared {
            segment: self.u64()?,
            offset: self.u64()?,
            len: self.u64()?,
            lease: self.u64()?,
        })
    }
    pub(super) fn part(&mut self) -> Result<Part, DecodeError> {
        match self.u8()? {
            0 => Ok(Part::Inline(self.owned_bytes()?)),
            1 => Ok(Part::Shared(self.shared()?)),
            2 => Ok(Part::Returned(Returned {
                segment: self.u64()?,
                offset: self.u64()?,
                len: self.u64()?,
            })),
            _ => Err(DecodeError("unknown part kind")),
        }
    }
    pub(super) fn body(&mut self) -> Result<Body, DecodeError> {
        match self.u8()? {
            0 => Ok(Body::Inline(self.owned_bytes()?)),
            1 => Ok(Body::Packed(self.shared()?)),
            2 => {
                let version = self.u32()?;
                let metadata = self.part()?;
                // Every part takes at least 5 bytes (tag + an empty inline length).
                let count = self.count(5)?;
                let buffers = (0..count).map(|_| self.part()).collect::<Result<_, _>>()?;
                Ok(Body::Parts {
                    version,
                    metadata,
                    buffers,
                })
            }
            _ => Err(DecodeError("unknown body kind")),
        }
    }
}
