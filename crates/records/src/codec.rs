//! Versioned binary encodings of the queue's values: the hook envelope, the delivery row,
//! and the index values. Each starts with a version byte; a value that does not decode is
//! a [`DecodeError`], never a panic, so a damaged row can be dead-lettered or dropped
//! through the normal counted path.

/// A value that does not have the encoding its family promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable {what}: {reason}")]
pub struct DecodeError {
    pub what: &'static str,
    pub reason: &'static str,
}

/// Appends fields to a value.
#[derive(Debug, Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn with_version(v: u8) -> Self {
        Enc(vec![v])
    }
    /// A value of about `size` bytes in all (the version byte included).
    pub fn with_version_and_capacity(v: u8, size: usize) -> Self {
        let mut b = Vec::with_capacity(size.max(1));
        b.push(v);
        Enc(b)
    }
    pub fn u8(&mut self, x: u8) -> &mut Self {
        self.0.push(x);
        self
    }
    pub fn u16(&mut self, x: u16) -> &mut Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    pub fn u32(&mut self, x: u32) -> &mut Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    pub fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    /// A length-prefixed (u32) byte string.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// Reads fields of a value in order.
#[derive(Debug)]
pub struct Dec<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Dec { buf, what }
    }
    fn err(&self, reason: &'static str) -> DecodeError {
        DecodeError {
            what: self.what,
            reason,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(self.err("truncated"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    /// Reads the version byte: one of `known`.
    pub fn version_of(&mut self, known: &[u8]) -> Result<u8, DecodeError> {
        let v = self.u8()?;
        if known.contains(&v) {
            Ok(v)
        } else {
            Err(self.err("unknown version"))
        }
    }
    /// Checks the version byte.
    pub fn version(&mut self, expected: u8) -> Result<(), DecodeError> {
        if self.u8()? == expected {
            Ok(())
        } else {
            Err(self.err("unknown version"))
        }
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn string(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("not UTF-8"))
    }
    /// Fails if bytes are left over.
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.err("trailing bytes"))
        }
    }
}
