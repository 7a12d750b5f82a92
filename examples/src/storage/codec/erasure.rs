//! The erasure code: two data shards and one parity shard, the parity being the recovery
//! shard of the Reed–Solomon code of `reed-solomon-simd` 3 with 2 original shards and 1
//! recovery shard (what the format was first written with).
//!
//! For that shape the library's code is plain XOR: with one recovery shard its transforms run
//! over chunks of one shard, where they are identities, and the encoder only adds (XORs) the
//! two originals together, element by element of GF(2^16). Addition works byte by byte, so
//! neither the library's layout of a shard nor its padding to 64 bytes matters: the parity is
//! `data 1 ⊕ data 2`, and a lost data shard is the other one ⊕ the parity. The tests prove
//! both against the library (`tests/parity.rs`), byte for byte, over many lengths.
//!
//! This costs a pass over the shards, where the library's decoder cost some 150 µs per block
//! whatever its size, and needs no working space of its own.

/// Writes the parity of the data shards `s1` and `s2` into `parity`. All three have one
/// length, which the caller's checks ensure.
pub(super) fn parity_into(s1: &[u8], s2: &[u8], parity: &mut [u8]) {
    xor_into(s1, s2, parity);
}

/// Writes into `lost` the data shard that the other one, `surviving`, and `parity` leave. All
/// three have one length, which the caller's checks ensure.
pub(super) fn rebuild_into(surviving: &[u8], parity: &[u8], lost: &mut [u8]) {
    xor_into(surviving, parity, lost);
}

/// `out = a ⊕ b`, eight bytes at a time (the compiler widens the loop to the vector
/// registers the target has). Equal lengths are the callers' promise; were it broken, only
/// the shortest length would be written, without a panic, and the checksum of a rebuilt shard
/// would not match.
fn xor_into(a: &[u8], b: &[u8], out: &mut [u8]) {
    debug_assert!(a.len() == out.len() && b.len() == out.len());
    let n = out.len().min(a.len()).min(b.len());
    let (a, b, out) = (&a[..n], &b[..n], &mut out[..n]);
    let (a_words, a_tail) = a.as_chunks::<8>();
    let (b_words, b_tail) = b.as_chunks::<8>();
    let (out_words, out_tail) = out.as_chunks_mut::<8>();
    for ((o, a), b) in out_words.iter_mut().zip(a_words).zip(b_words) {
        *o = (u64::from_ne_bytes(*a) ^ u64::from_ne_bytes(*b)).to_ne_bytes();
    }
    for ((o, a), b) in out_tail.iter_mut().zip(a_tail).zip(b_tail) {
        *o = a ^ b;
    }
}
