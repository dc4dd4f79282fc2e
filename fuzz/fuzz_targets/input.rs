#![allow(dead_code)] // each target uses some of the readers
//! Reading a fuzzer's bytes as the fields of a C struct: a cursor that yields zeros once the
//! input is used up (so every input decodes to something).

pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    pub fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.bytes())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    /// `n` bytes, fewer when the input ends first.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    /// The rest of the input.
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.0.len())
    }

    /// An enum-like code: mostly one of the first `known + 4` values (the known ones and a few
    /// past them), sometimes any `u32`.
    pub fn code(&mut self, known: u32) -> u32 {
        let b = self.u8();
        if b < 0xf0 {
            u32::from(b) % (known + 4)
        } else {
            self.u32()
        }
    }
}
