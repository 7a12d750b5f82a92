//! A message encoded for its frame: a small one (most control messages: a length, a block
//! index and its offsets) in place, with no allocation; a larger one in [`Bytes`].
//!
//! A typed call used to encode its message into a `Vec` turned into `Bytes`, copied into the
//! frame and freed: a `malloc` and a `free` per message, on the client and on the server, for
//! a message of a few bytes. Kept in place, the message is written into its frame from where
//! it is (`protocol::hot`, the message handed beside the frame), and nothing is allocated.
//! (The client's requests so far; a handler's response still comes as `Bytes`, the type
//! [`Service::call`](crate::Service::call) returns.)

use bytes::Bytes;

/// The largest message kept in place: as many bytes as fit beside the length in the room of
/// the `Bytes` a larger one takes, so that an `Encoded` is no larger than `Bytes` (32 bytes)
/// and a call's state does not grow (`client::call::future_sizes`). A length, a block index
/// and its offsets as varints fit.
pub(crate) const SMALL: usize = 22;

/// A small message, in place.
#[derive(Clone, Copy)]
pub(crate) struct Small {
    len: u8,
    buf: [u8; SMALL],
}

impl Small {
    /// The message's bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Small {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Small").field(&self.as_slice()).finish()
    }
}

/// An encoded message (see the module docs).
#[derive(Clone, Debug)]
pub(crate) enum Encoded {
    Small(Small),
    Bytes(Bytes),
}

impl Default for Encoded {
    fn default() -> Encoded {
        Encoded::Bytes(Bytes::new())
    }
}

impl From<Bytes> for Encoded {
    fn from(bytes: Bytes) -> Encoded {
        Encoded::Bytes(bytes)
    }
}

impl Encoded {
    /// `message`, encoded: in place when it encodes to at most [`SMALL`] bytes.
    pub(crate) fn of<M: prost::Message>(message: &M) -> Encoded {
        let len = message.encoded_len();
        if len > SMALL {
            return Encoded::Bytes(Bytes::from(message.encode_to_vec()));
        }
        let mut small = Small {
            len: len as u8, // at most SMALL
            buf: [0; SMALL],
        };
        let mut out = &mut small.buf[..];
        message.encode_raw(&mut out);
        Encoded::Small(small)
    }

    /// Bytes of the message.
    pub(crate) fn len(&self) -> usize {
        match self {
            Encoded::Small(s) => usize::from(s.len),
            Encoded::Bytes(b) => b.len(),
        }
    }

    /// The message as `Bytes`, for a path that keeps it (a small message is copied out).
    pub(crate) fn into_bytes(self) -> Bytes {
        match self {
            Encoded::Small(s) => Bytes::copy_from_slice(s.as_slice()),
            Encoded::Bytes(b) => b,
        }
    }

    /// What a frame holds of the message, and the small message written beside it: a
    /// message in `Bytes` goes in the frame, a small one stays here (the frame's field is
    /// empty, and its encoder is handed the small message: `Hot::request_with`).
    pub(crate) fn split(self) -> (Bytes, Option<Small>) {
        match self {
            Encoded::Small(s) => (Bytes::new(), Some(s)),
            Encoded::Bytes(b) => (b, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message of `len` encoded bytes (a `bytes` field of `len - 2` bytes: its tag and its
    /// one-byte length come first; an empty field is not encoded at all).
    fn message(len: usize) -> Vec<u8> {
        assert!((3..130).contains(&len));
        vec![0x5a; len - 2]
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Blob {
        #[prost(bytes = "vec", tag = "1")]
        data: Vec<u8>,
    }

    /// Up to `SMALL` bytes a message is kept in place, past it in `Bytes`; either way its
    /// bytes are prost's, and `split` puts them in the frame or beside it, never both.
    #[test]
    fn a_message_is_kept_in_place_up_to_small_and_encodes_as_prost_does() {
        for len in [3, 4, SMALL - 1, SMALL, SMALL + 1, 100] {
            let blob = Blob { data: message(len) };
            let expected = prost::Message::encode_to_vec(&blob);
            assert_eq!(expected.len(), len);
            let encoded = Encoded::of(&blob);
            assert_eq!(
                matches!(encoded, Encoded::Small(_)),
                len <= SMALL,
                "{len} bytes"
            );
            assert_eq!(encoded.len(), len);
            assert_eq!(encoded.clone().into_bytes(), expected);
            let (framed, beside) = encoded.split();
            match beside {
                Some(small) => {
                    assert!(framed.is_empty());
                    assert_eq!(small.as_slice(), &expected[..]);
                }
                None => assert_eq!(framed, expected),
            }
        }
        let empty = Encoded::of(&());
        assert_eq!(empty.len(), 0);
        assert!(empty.into_bytes().is_empty());
    }

    #[test]
    fn an_encoded_message_is_no_larger_than_bytes() {
        assert_eq!(std::mem::size_of::<Encoded>(), std::mem::size_of::<Bytes>());
    }
}
