//! Per-call metadata: key, value pairs a client attaches to a call (an auth token, a trace
//! id) and the handler reads, next to the typed message.
//!
//! ```
//! use rdma_rpc_core::{Metadata, Request};
//!
//! let mut request = Request::new(());
//! request.metadata_mut().insert("authorization", "Bearer 0123");
//! request.metadata_mut().insert("x-trace-id", "4bf92f35");
//! // A handler reads them back:
//! assert_eq!(request.metadata().get_str("authorization"), Some("Bearer 0123"));
//! ```
//!
//! Keys are 1 to [`MAX_KEY_LEN`] bytes of lowercase ASCII letters, digits, `-`, `_` and `.`
//! (as gRPC's); values are any bytes. A call whose metadata has a bad key, or more than
//! [`MAX_ENTRIES`] entries, fails with `INVALID_ARGUMENT` before anything is sent (the server
//! checks again). Metadata travels in the request frame, so it counts towards the request
//! message's limit.

use bytes::Bytes;

use crate::protocol::frames::MetadataEntry;
use crate::status::Status;

/// Longest metadata key, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Most entries of one call's metadata.
pub const MAX_ENTRIES: usize = 64;

/// Key, value pairs of one call. Keys are unique: [`insert`](Metadata::insert) replaces.
///
/// Entries are kept as they travel: sending a call's metadata moves them into its request,
/// and a handler's metadata is the request's entries, slices of the frame they came in.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<MetadataEntry>,
}

impl std::fmt::Debug for Metadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// A key as text: every key is UTF-8 (see [`MetadataEntry::key`]).
fn key_str(key: &Bytes) -> &str {
    std::str::from_utf8(key).unwrap_or_default()
}

impl Metadata {
    /// No entries.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Sets `key` to `value`, replacing what it held; returns the old value. The key is
    /// checked when the call is made.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Option<Bytes> {
        // The string's own allocation becomes the key's: no copy.
        self.put(Bytes::from(key.into()), value.into())
    }

    /// [`insert`](Self::insert) for a key known when the program is built: the key is not
    /// copied or allocated, as suits an interceptor that sets it on every call.
    pub fn insert_static(&mut self, key: &'static str, value: impl Into<Bytes>) -> Option<Bytes> {
        self.put(Bytes::from_static(key.as_bytes()), value.into())
    }

    fn put(&mut self, key: Bytes, value: Bytes) -> Option<Bytes> {
        match self.entries.iter_mut().find(|e| e.key == key) {
            Some(old) => Some(std::mem::replace(&mut old.value, value)),
            None => {
                self.entries.push(MetadataEntry { key, value });
                None
            }
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Bytes> {
        self.entries
            .iter()
            .find(|e| e.key.as_ref() == key.as_bytes())
            .map(|e| &e.value)
    }

    /// The value of `key`, if it is UTF-8.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: &str) -> Option<Bytes> {
        let at = self
            .entries
            .iter()
            .position(|e| e.key.as_ref() == key.as_bytes())?;
        Some(self.entries.remove(at).value)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, in the order they were first inserted.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.entries.iter().map(|e| (key_str(&e.key), &e.value))
    }

    /// Checks every key and the number of entries.
    pub(crate) fn check(&self) -> Result<(), Status> {
        check_count(self.entries.len())?;
        for e in &self.entries {
            check_key(key_str(&e.key))?;
        }
        Ok(())
    }

    /// The entries as they travel, copied (each key and value shared, not copied).
    pub(crate) fn to_frames(&self) -> Vec<MetadataEntry> {
        self.entries.clone()
    }

    /// The entries as they travel, moved.
    pub(crate) fn into_frames(self) -> Vec<MetadataEntry> {
        self.entries
    }

    /// The entries as they travel, for a request that takes them only if it is sent.
    pub(crate) fn frames_mut(&mut self) -> &mut Vec<MetadataEntry> {
        &mut self.entries
    }

    /// Metadata a peer sent: checked like the sender's, duplicates refused. The entries are
    /// kept as they came.
    pub(crate) fn from_frames(entries: Vec<MetadataEntry>) -> Result<Metadata, Status> {
        check_count(entries.len())?;
        for (at, e) in entries.iter().enumerate() {
            // Checked as bytes first: a peer's key may be anything.
            let key = std::str::from_utf8(&e.key).map_err(|_| {
                Status::invalid_argument(format!(
                    "metadata key `{}` is not UTF-8",
                    crate::observe::logs::shown(&String::from_utf8_lossy(&e.key))
                ))
            })?;
            check_key(key)?;
            if entries[..at].iter().any(|earlier| earlier.key == e.key) {
                return Err(Status::invalid_argument(format!(
                    "metadata key `{key}` appears twice"
                )));
            }
        }
        Ok(Metadata { entries })
    }
}

fn check_count(entries: usize) -> Result<(), Status> {
    if entries > MAX_ENTRIES {
        return Err(Status::invalid_argument(format!(
            "{entries} metadata entries, more than the {MAX_ENTRIES} a call may carry"
        )));
    }
    Ok(())
}

impl<'a> IntoIterator for &'a Metadata {
    type Item = (&'a str, &'a Bytes);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a Bytes)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

fn check_key(key: &str) -> Result<(), Status> {
    let valid = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b);
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(valid) {
        // The key may be a peer's: shown cut short, never longer than it came.
        return Err(Status::invalid_argument(format!(
            "metadata key `{}` is not 1 to {MAX_KEY_LEN} bytes of lowercase ASCII letters, \
             digits, `-`, `_` or `.`",
            crate::observe::logs::shown(key)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn insert_replaces_and_keeps_order() {
        let mut m = Metadata::new();
        assert_eq!(m.insert("b", "1"), None);
        assert_eq!(m.insert_static("a", "2"), None);
        assert_eq!(m.insert_static("b", "3"), Some(Bytes::from("1")));
        assert_eq!(m.insert(String::from("a"), "2"), Some(Bytes::from("2")));
        let keys: Vec<_> = m.iter().map(|(k, v)| (k, v.clone())).collect();
        assert_eq!(keys, [("b", Bytes::from("3")), ("a", Bytes::from("2"))]);
        assert_eq!(m.remove("b"), Some(Bytes::from("3")));
        assert_eq!(m.len(), 1);
        assert_eq!(m.get_str("a"), Some("2"));
    }

    #[test]
    fn keys_are_checked_on_both_ends() {
        for bad in [
            "",
            "Authorization",
            "a b",
            "ключ",
            &"k".repeat(MAX_KEY_LEN + 1),
        ] {
            let mut m = Metadata::new();
            m.insert(bad, "v");
            assert_eq!(
                m.check().unwrap_err().code(),
                Code::InvalidArgument,
                "{bad:?}"
            );
            let err = Metadata::from_frames(m.to_frames()).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}");
        }
        let mut m = Metadata::new();
        m.insert("x-trace_id.1", "v");
        m.check().unwrap();
        assert_eq!(Metadata::from_frames(m.to_frames()).unwrap(), m);
        assert_eq!(Metadata::from_frames(m.clone().into_frames()).unwrap(), m);
        assert_eq!(format!("{m:?}"), r#"{"x-trace_id.1": b"v"}"#);
    }

    #[test]
    fn a_hostile_key_is_shown_cut_short() {
        let key: String = (0..MAX_KEY_LEN as u8).map(|b| char::from(b % 32)).collect();
        let err = Metadata::from_frames(vec![MetadataEntry {
            key: key.clone().into(),
            value: Bytes::new(),
        }])
        .unwrap_err();
        let message = err.message();
        // At most 64 bytes of the key, each control character one `?`: as a log shows it
        // (escaped), the whole message is shorter than the key alone escaped.
        assert!(message.contains("`????"), "{message}");
        let logged = format!("{message:?}");
        assert!(logged.len() < 256, "{logged}");
        assert!(logged.len() < format!("{key:?}").len() / 2, "{logged}");
    }

    #[test]
    fn a_peer_cannot_send_duplicates_or_too_many() {
        let entry = |key: &str| MetadataEntry {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::new(),
        };
        let err = Metadata::from_frames(vec![entry("a"), entry("b"), entry("a")]).unwrap_err();
        assert!(err.message().contains("`a` appears twice"), "{err}");
        // A key that is not UTF-8 is the call's error, not the connection's.
        let err = Metadata::from_frames(vec![MetadataEntry {
            key: Bytes::from_static(b"k\xff"),
            value: Bytes::new(),
        }])
        .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("not UTF-8"), "{err}");
        let many = (0..=MAX_ENTRIES).map(|i| entry(&format!("k{i}"))).collect();
        let err = Metadata::from_frames(many).unwrap_err();
        assert!(err.message().contains("more than"), "{err}");
    }
}
