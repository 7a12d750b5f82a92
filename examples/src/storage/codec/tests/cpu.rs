//! [`CpuCodec`] through the [`Codec`] trait: the bytes of the free functions (and of the codec
//! before the trait existed), in and out of buffers of the caller's; wrong buffers refused.

use super::*;

/// CRC32 of bytes `0 .. S-4` of data 1, data 2 and parity (each half's own checksum) for every
/// block of `blocks(b)` at index `b·7 + len`, as the codec wrote them before [`Codec`] existed
/// (`examples/src/storage/codec.rs` at commit 1ab8f54). The format must not change.
const GOLDEN: [(usize, &str, [u32; 3]); 35] = [
    (2, "compressible", [0x9dbf0e96, 0xb173bd3e, 0x3f1b2208]),
    (2, "incompressible", [0xfb710670, 0x49c61c1e, 0x89be133b]),
    (2, "zeros", [0xff75884b, 0x80367660, 0x226dbec9]),
    (
        2,
        "short compressible",
        [0x8949cd93, 0xa8c975c5, 0x5451fb11],
    ),
    (
        2,
        "short incompressible",
        [0xadb5c050, 0xb18715c4, 0x4139a236],
    ),
    (2, "one byte", [0x54e1c813, 0xe25b63f3, 0x31df670e]),
    (2, "empty", [0x8949cd93, 0xa8c975c5, 0x5451fb11]),
    (64, "compressible", [0xcccaff31, 0xbd4d4ded, 0x11d2c9b3]),
    (64, "incompressible", [0x5d20c392, 0xd4a336ce, 0x8038f510]),
    (64, "zeros", [0x101e7273, 0xe3b5b4b0, 0xcd0644f1]),
    (
        64,
        "short compressible",
        [0xfcef0a85, 0xd2914332, 0x21f73c07],
    ),
    (
        64,
        "short incompressible",
        [0x42feafb5, 0xf586330f, 0x9fe69937],
    ),
    (64, "one byte", [0x9a18ac1d, 0x87e23b31, 0x47009a9f]),
    (64, "empty", [0x431f26b3, 0x2cc5aa83, 0x9e071031]),
    (4096, "compressible", [0x277837c8, 0xe241491c, 0xfa60014a]),
    (4096, "incompressible", [0x46e47ed7, 0x6b3de200, 0xee8259b8]),
    (4096, "zeros", [0xe982e351, 0x34c34cc4, 0x349ad5d3]),
    (
        4096,
        "short compressible",
        [0x221a1eb2, 0x11ab62dc, 0xff022830],
    ),
    (
        4096,
        "short incompressible",
        [0xf687117d, 0x5ee764df, 0x2b9f27ff],
    ),
    (4096, "one byte", [0x83b5c3b1, 0x1b507454, 0x5eadf533]),
    (4096, "empty", [0x2ac16c9a, 0x53357776, 0xf7d95a18]),
    (65536, "compressible", [0x88d18446, 0xc08e34c5, 0x55c9b2c4]),
    (
        65536,
        "incompressible",
        [0x679a75f6, 0xf7c308c0, 0x0671a1e0],
    ),
    (65536, "zeros", [0x49b2ab98, 0xa7f33f22, 0x94aa9d1a]),
    (
        65536,
        "short compressible",
        [0x316f8c3b, 0x0f825038, 0xec77bab9],
    ),
    (
        65536,
        "short incompressible",
        [0x62836245, 0x70c09164, 0xbf9b54c7],
    ),
    (65536, "one byte", [0x0f6adffe, 0xab9fbaf6, 0xd272e97c]),
    (65536, "empty", [0xc9341920, 0x077f5c36, 0x142c2fa2]),
    (
        1 << 20,
        "compressible",
        [0x398b6e77, 0x6ff322b8, 0xe49358f5],
    ),
    (
        1 << 20,
        "incompressible",
        [0xe933c355, 0x55d3742a, 0xc9dce21b],
    ),
    (1 << 20, "zeros", [0xd1212df1, 0xb1b3aa2e, 0x0c391b73]),
    (
        1 << 20,
        "short compressible",
        [0x34c2a132, 0x95ff0197, 0xe9da97b0],
    ),
    (
        1 << 20,
        "short incompressible",
        [0xc2b7fa90, 0xd2203a20, 0x1fafcc12],
    ),
    (1 << 20, "one byte", [0x4e6a3e83, 0x4483e624, 0x93720801]),
    (1 << 20, "empty", [0x456e06e3, 0x004c2912, 0x98763061]),
];

/// Each half's own checksum, computed from its bytes.
fn fingerprint(halves: [&[u8]; 3]) -> [u32; 3] {
    halves.map(|h| crc32fast::hash(&h[..h.len() - 4]))
}

/// Three half buffers of `codec`'s size, full of a byte that the codec must overwrite.
fn dirty_halves(codec: &CpuCodec) -> [Vec<u8>; 3] {
    [(); 3].map(|()| vec![0xa5; codec.half_size()])
}

/// `encode_into` into `halves`, as an [`Encoded`] would hold it: the payload length.
fn encode_with(codec: &dyn Codec, index: u64, block: &[u8], halves: &mut [Vec<u8>; 3]) -> usize {
    let [d1, d2, p] = halves;
    codec.encode_into(index, block, [d1, d2, p]).unwrap()
}

#[test]
fn both_interfaces_write_the_bytes_of_the_format() {
    // Every size up, then down again: the thread's scratch grows and is reused at a smaller
    // size, and neither changes a byte.
    let cases = GOLDEN.iter().chain(GOLDEN.iter().rev());
    for &(b, kind, golden) in cases {
        let block = blocks(b).into_iter().find(|(k, _)| *k == kind).unwrap().1;
        let index = b as u64 * 7 + block.len() as u64;
        let e = encode(index, &block, b).unwrap();
        assert_eq!(
            fingerprint([&e.data1, &e.data2, &e.parity]),
            golden,
            "encode, {kind}, B={b}"
        );

        let codec = CpuCodec::new(b).unwrap();
        let mut halves = dirty_halves(&codec);
        let len = encode_with(&codec, index, &block, &mut halves);
        assert_eq!(len, e.compressed_len, "{kind}, B={b}");
        assert!(
            halves == [e.data1, e.data2, e.parity],
            "encode_into, {kind}, B={b}: not the bytes encode wrote"
        );
    }
}

#[test]
fn halves_of_either_interface_are_read_by_the_other() {
    for b in [2, 64, 4096, 65536] {
        let codec = CpuCodec::new(b).unwrap();
        assert_eq!(
            (codec.block_size(), codec.half_size()),
            (b, stored_half_size(b).unwrap())
        );
        let mut out = vec![0x5a; b + 7];
        for (kind, block) in blocks(b) {
            let what = format!("{kind}, B={b}");
            // encode -> the trait's reads.
            let e = encode(9, &block, b).unwrap();
            let n = codec.decode_into(9, &e.data1, &e.data2, &mut out).unwrap();
            assert_eq!(&out[..n], &block[..], "decode_into, {what}");
            for surviving_is in [Half::Data1, Half::Data2] {
                out.fill(0x5a);
                let surviving = e.half(surviving_is);
                let n = codec
                    .recover_into(9, surviving, surviving_is, &e.parity, &mut out)
                    .unwrap();
                assert_eq!(&out[..n], &block[..], "recover_into {surviving_is}, {what}");
            }

            // encode_into -> the free functions.
            let mut halves = dirty_halves(&codec);
            encode_with(&codec, 9, &block, &mut halves);
            let [d1, d2, p] = &halves;
            assert_eq!(decode(9, d1, d2, b).unwrap(), block, "decode, {what}");
            assert_eq!(
                recover(9, d2, Half::Data2, p, b).unwrap(),
                block,
                "recover, {what}"
            );
            assert_eq!(
                rebuild_half(9, d1, Half::Data1, p, b).unwrap(),
                *d2,
                "rebuild_half, {what}"
            );
        }
    }
}

#[test]
fn the_trait_reads_refuse_what_the_free_functions_refuse() {
    let codec = CpuCodec::new(B).unwrap();
    let mut rng = XorShift::new(0x0bad_cafe);
    let mut out = vec![0u8; B];
    for round in 0..200 {
        let source = if round % 2 == 0 {
            compressible(B)
        } else {
            incompressible(B, round)
        };
        let mut e = encode(12, &source, B).unwrap();
        // Bytes changed in the stream (every checksum recomputed, half the time) or anywhere.
        for _ in 0..1 + rng.below(3) {
            let pos = rng.below(e.data1.len());
            let byte = rng.next() as u8;
            if rng.below(2) == 0 {
                e.data1[pos] = byte;
            } else {
                e.data2[pos] = byte;
            }
        }
        if round % 2 == 0 {
            reseal(&mut e, 12, B);
        }
        let surviving_is = if rng.below(2) == 0 {
            Half::Data1
        } else {
            Half::Data2
        };
        let surviving = e.half(surviving_is);

        let free = decode(12, &e.data1, &e.data2, B);
        let into = codec.decode_into(12, &e.data1, &e.data2, &mut out);
        match (free, into) {
            (Ok(block), Ok(n)) => assert_eq!(&out[..n], &block[..], "round {round}"),
            (free, into) => assert_eq!(free.err(), into.err(), "round {round}"),
        }
        let free = recover(12, surviving, surviving_is, &e.parity, B);
        let into = codec.recover_into(12, surviving, surviving_is, &e.parity, &mut out);
        match (free, into) {
            (Ok(block), Ok(n)) => assert_eq!(&out[..n], &block[..], "round {round}"),
            (free, into) => assert_eq!(free.err(), into.err(), "round {round}"),
        }
    }
}

#[test]
fn wrong_buffers_are_refused_without_a_panic() {
    let codec = CpuCodec::new(B).unwrap();
    let s = codec.half_size();
    let block = compressible(B);

    // Halves to encode into, one of them of the wrong size.
    for (k, slot) in Slot::ALL.into_iter().enumerate() {
        for len in [0, 1, s - 1, s + 1, 2 * s] {
            let mut halves = [(); 3].map(|()| vec![0u8; s]);
            halves[k] = vec![0u8; len];
            let [d1, d2, p] = &mut halves;
            assert_eq!(
                codec.encode_into(3, &block, [d1, d2, p]),
                Err(CodecError::WrongBufferLength {
                    index: 3,
                    slot,
                    expected: s,
                    found: len,
                }),
                "{slot} of {len} bytes"
            );
        }
    }
    let mut halves = [(); 3].map(|()| vec![0u8; s]);
    let [d1, d2, p] = &mut halves;
    assert_eq!(
        codec.encode_into(3, &vec![7u8; B + 1], [d1, d2, p]),
        Err(CodecError::BlockTooLarge {
            index: 3,
            len: B + 1,
            block_size: B,
        })
    );

    // Output buffers shorter than a block, even for a block that would fit.
    let e = encode(3, &compressible(100), B).unwrap();
    for len in [0, 100, B - 1] {
        let mut out = vec![0u8; len];
        let want = Err(CodecError::OutputTooSmall {
            index: 3,
            needed: B,
            found: len,
        });
        assert_eq!(codec.decode_into(3, &e.data1, &e.data2, &mut out), want);
        assert_eq!(
            codec.recover_into(3, &e.data1, Half::Data1, &e.parity, &mut out),
            want
        );
    }

    // Halves to read of the wrong size.
    let mut out = vec![0u8; B];
    let short = &e.data2[..s - 1];
    let wrong = |slot, found| {
        Err(CodecError::WrongHalfLength {
            index: 3,
            slot,
            expected: s,
            found,
        })
    };
    assert_eq!(
        codec.decode_into(3, &e.data1, short, &mut out),
        wrong(Slot::Data2, s - 1)
    );
    assert_eq!(
        codec.decode_into(3, &[], &e.data2, &mut out),
        wrong(Slot::Data1, 0)
    );
    assert_eq!(
        codec.recover_into(3, short, Half::Data2, &e.parity, &mut out),
        wrong(Slot::Data2, s - 1)
    );
    assert_eq!(
        codec.recover_into(3, &e.data1, Half::Data1, &e.parity[..8], &mut out),
        wrong(Slot::Parity, 8)
    );

    // Halves of a codec of another block size.
    let other = CpuCodec::new(2 * B).unwrap();
    assert_eq!(
        other.decode_into(3, &e.data1, &e.data2, &mut vec![0u8; 2 * B]),
        Err(CodecError::WrongHalfLength {
            index: 3,
            slot: Slot::Data1,
            expected: other.half_size(),
            found: s,
        })
    );
}

#[test]
fn bad_block_sizes_are_refused() {
    for bad in [0, 3, 4097, MAX_BLOCK_SIZE + 2, usize::MAX] {
        assert_eq!(
            CpuCodec::new(bad),
            Err(CodecError::BadBlockSize { block_size: bad })
        );
    }
    assert_eq!(
        CpuCodec::new(MAX_BLOCK_SIZE).map(|c| c.block_size()),
        Ok(MAX_BLOCK_SIZE)
    );
}

#[test]
fn a_codec_is_shared_as_a_trait_object() {
    let codec: std::sync::Arc<dyn Codec> = std::sync::Arc::new(CpuCodec::new(B).unwrap());
    let block = incompressible(B, 21);
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let codec = codec.clone();
            let block = block.clone();
            std::thread::spawn(move || {
                let mut halves = [(); 3].map(|()| vec![0u8; codec.half_size()]);
                let mut out = vec![0u8; codec.block_size()];
                for index in t * 10..t * 10 + 10 {
                    assert_eq!(encode_with(&*codec, index, &block, &mut halves), B);
                    let [d1, d2, _] = &halves;
                    let n = codec.decode_into(index, d1, d2, &mut out).unwrap();
                    assert_eq!(&out[..n], &block[..]);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn buffer_error_messages_say_what_the_caller_got_wrong() {
    assert_eq!(
        CodecError::WrongBufferLength {
            index: 3,
            slot: Slot::Parity,
            expected: 2112,
            found: 2000,
        }
        .to_string(),
        "buffer for the parity half of block 3 is 2000 bytes, it must be exactly 2112"
    );
    assert_eq!(
        CodecError::OutputTooSmall {
            index: 3,
            needed: 4096,
            found: 10,
        }
        .to_string(),
        "output buffer for block 3 is 10 bytes, it must hold the block size, 4096"
    );
}
