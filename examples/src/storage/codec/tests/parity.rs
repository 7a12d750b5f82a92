//! The parity is XOR and is the Reed–Solomon code of `reed-solomon-simd` 3 with 2 original
//! shards and 1 recovery shard, byte for byte: the library's encoder and decoder are the
//! reference that the XOR parity and the XOR rebuild are compared with, over every even shard
//! length up to 512 (every remainder of the library's padding to 64 bytes) and random lengths
//! beyond, then through the codec's halves for many block sizes.

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use super::*;

/// The shard lengths tested: every even length up to 512, then `random` random even ones up
/// to 600 000 and the shards of the block sizes of [`SIZES`].
fn lengths(rng: &mut XorShift, random: usize) -> Vec<usize> {
    let mut lengths: Vec<usize> = (2..=512).step_by(2).collect();
    lengths.extend((0..random).map(|_| 2 * (257 + rng.below(300_000 - 257))));
    lengths.extend(SIZES.map(shard_len));
    lengths
}

/// Two data shards of `len` bytes: random ones, or (one time in eight) a pattern that random
/// bytes seldom give.
fn shards(rng: &mut XorShift, len: usize) -> [Vec<u8>; 2] {
    match rng.below(8) {
        0 => [vec![0xff; len], rng.bytes(len)],
        1 => [vec![0; len], vec![0; len]],
        2 => {
            let a = rng.bytes(len);
            [a.clone(), a]
        }
        _ => [rng.bytes(len), rng.bytes(len)],
    }
}

/// `a ⊕ b`, byte by byte: the reference, independent of the codec's word-wise loop.
fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// The index of a data half's shard among the library's original shards.
fn original_index(half: Half) -> usize {
    match half {
        Half::Data1 => 0,
        Half::Data2 => 1,
    }
}

/// The recovery shard that the library's encoder makes of `s1` and `s2`.
fn rs_parity(encoder: &mut ReedSolomonEncoder, s1: &[u8], s2: &[u8]) -> Vec<u8> {
    encoder.reset(2, 1, s1.len()).unwrap();
    encoder.add_original_shard(s1).unwrap();
    encoder.add_original_shard(s2).unwrap();
    encoder.encode().unwrap().recovery(0).unwrap().to_vec()
}

/// The `lost` data shard that the library's decoder restores from the other one and `parity`.
fn rs_rebuild(
    decoder: &mut ReedSolomonDecoder,
    surviving: &[u8],
    lost: Half,
    parity: &[u8],
) -> Vec<u8> {
    decoder.reset(2, 1, parity.len()).unwrap();
    decoder
        .add_original_shard(original_index(lost.other()), surviving)
        .unwrap();
    decoder.add_recovery_shard(0, parity).unwrap();
    let result = decoder.decode().unwrap();
    result
        .restored_original(original_index(lost))
        .unwrap()
        .to_vec()
}

#[test]
fn the_reed_solomon_parity_is_the_xor_of_the_data_shards() {
    let mut rng = XorShift::new(0x0000_9a71_7e57);
    let mut encoder = ReedSolomonEncoder::new(2, 1, 64).unwrap();
    let lengths = lengths(&mut rng, 200);
    for &len in &lengths {
        let [s1, s2] = shards(&mut rng, len);
        let expected = rs_parity(&mut encoder, &s1, &s2);
        assert_eq!(expected.len(), len);
        assert!(expected == xor(&s1, &s2), "shard length {len}");
        let mut parity = vec![0xa5; len];
        erasure::parity_into(&s1, &s2, &mut parity);
        assert!(parity == expected, "shard length {len}: the codec's parity");
    }
}

#[test]
fn the_xor_rebuild_is_the_reed_solomon_rebuild() {
    let mut rng = XorShift::new(0x0000_4eb1_1d00);
    let mut encoder = ReedSolomonEncoder::new(2, 1, 64).unwrap();
    let mut decoder = ReedSolomonDecoder::new(2, 1, 64).unwrap();
    for len in lengths(&mut rng, 60) {
        let [s1, s2] = shards(&mut rng, len);
        let parity = rs_parity(&mut encoder, &s1, &s2);
        for (lost, original, surviving) in [(Half::Data1, &s1, &s2), (Half::Data2, &s2, &s1)] {
            let expected = rs_rebuild(&mut decoder, surviving, lost, &parity);
            assert!(&expected == original, "shard length {len}, {lost} lost");
            let mut rebuilt = vec![0xa5; len];
            erasure::rebuild_into(surviving, &parity, &mut rebuilt);
            assert!(rebuilt == expected, "shard length {len}, {lost} lost: XOR");
        }
    }
}

#[test]
fn halves_carry_the_reed_solomon_parity_and_rebuild_as_its_decoder_does() {
    let mut rng = XorShift::new(0x0000_b10c_5123);
    let mut encoder = ReedSolomonEncoder::new(2, 1, 64).unwrap();
    let mut decoder = ReedSolomonDecoder::new(2, 1, 64).unwrap();
    let mut sizes = SIZES.to_vec();
    sizes.extend((0..24).map(|_| 2 * (1 + rng.below(150_000))));
    for b in sizes {
        let g = geometry(b).unwrap();
        for (kind, block) in blocks(b) {
            let index = rng.next();
            let e = encode(index, &block, b).unwrap();
            let shard = |half: &[u8]| half[..g.shard].to_vec();
            let (s1, s2, parity) = (shard(&e.data1), shard(&e.data2), shard(&e.parity));
            assert!(
                parity == rs_parity(&mut encoder, &s1, &s2),
                "{kind}, B={b}: the parity encode wrote is the library's"
            );
            for lost in [Half::Data1, Half::Data2] {
                let surviving = e.half(lost.other());
                assert!(
                    rs_rebuild(&mut decoder, &surviving[..g.shard], lost, &parity)
                        == e.half(lost)[..g.shard],
                    "{kind}, B={b}, {lost} lost: the library rebuilds the shard"
                );
                assert!(
                    rebuild_half(index, surviving, lost.other(), &e.parity, b).unwrap()
                        == e.half(lost),
                    "{kind}, B={b}, {lost} lost: XOR rebuilds the half"
                );
                assert_eq!(
                    recover(index, surviving, lost.other(), &e.parity, b).unwrap(),
                    block,
                    "{kind}, B={b}, {lost} lost"
                );
            }
        }
    }
}
