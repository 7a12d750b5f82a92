//! The Reed–Solomon part (2 original shards, 1 recovery shard): the parity of two data shards,
//! and a data shard rebuilt from the other one and the parity. The coders are the caller's
//! (a thread's [`Scratch`](super::scratch::Scratch)), reset and reused for every block.

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use super::{CodecError, Half};

/// Original (data) shards per block.
const ORIGINAL: usize = 2;
/// Recovery (parity) shards per block.
const RECOVERY: usize = 1;

/// Writes the parity of the data shards `s1` and `s2` (of one length) into `parity` (of the
/// same length), with `encoder` (created on first use, reset and reused after).
pub(super) fn parity_into(
    encoder: &mut Option<ReedSolomonEncoder>,
    index: u64,
    s1: &[u8],
    s2: &[u8],
    parity: &mut [u8],
) -> Result<(), CodecError> {
    let shard = parity.len();
    let erasure = |e| CodecError::erasure(index, e);
    let rs = match encoder.take() {
        Some(mut rs) => rs.reset(ORIGINAL, RECOVERY, shard).map(|()| rs),
        None => ReedSolomonEncoder::new(ORIGINAL, RECOVERY, shard),
    }
    .map_err(erasure)?;
    let rs = encoder.insert(rs);
    rs.add_original_shard(s1).map_err(erasure)?;
    rs.add_original_shard(s2).map_err(erasure)?;
    let result = rs.encode().map_err(erasure)?;
    match result.recovery(0) {
        Some(recovery) if recovery.len() == shard => {
            parity.copy_from_slice(recovery);
            Ok(())
        }
        _ => Err(CodecError::Erasure {
            index,
            detail: format!("no recovery shard of {shard} bytes"),
        }),
    }
}

/// Rebuilds the data shard that is not `surviving_is` from `surviving` and `parity` (of one
/// length), with `decoder` (created on first use, reset and reused after), and gives it to
/// `f` where it lies, in the decoder's working space.
pub(super) fn rebuild<R>(
    decoder: &mut Option<ReedSolomonDecoder>,
    index: u64,
    surviving: &[u8],
    surviving_is: Half,
    parity: &[u8],
    f: impl FnOnce(&[u8]) -> Result<R, CodecError>,
) -> Result<R, CodecError> {
    let shard = parity.len();
    let erasure = |e| CodecError::erasure(index, e);
    let rs = match decoder.take() {
        Some(mut rs) => rs.reset(ORIGINAL, RECOVERY, shard).map(|()| rs),
        None => ReedSolomonDecoder::new(ORIGINAL, RECOVERY, shard),
    }
    .map_err(erasure)?;
    let rs = decoder.insert(rs);
    rs.add_original_shard(surviving_is.shard_index(), surviving)
        .map_err(erasure)?;
    rs.add_recovery_shard(0, parity).map_err(erasure)?;
    let result = rs.decode().map_err(erasure)?;
    let missing = surviving_is.other();
    match result.restored_original(missing.shard_index()) {
        Some(rebuilt) if rebuilt.len() == shard => f(rebuilt),
        _ => Err(CodecError::Erasure {
            index,
            detail: format!("the {missing} shard was not restored"),
        }),
    }
}
