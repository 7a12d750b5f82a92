//! The dynamic codec against prost's generated types for the same spec: the same bytes out,
//! the same values back.

use rdma_rpc_core::codegen::prost::Message as _;
use serde_json::{json, Value};

use super::{decode, encode, json_name, CodecError};

rdma_rpc_core::spec!("tests/specs/inventory.yaml");

fn service() -> rdma_rpc_codegen::ServiceIr {
    rdma_rpc_codegen::load_spec(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/specs/inventory.yaml"
    ))
    .unwrap()
}

/// An item with every field away from its default.
fn full_item() -> (Item, Value) {
    let item = Item {
        name: "widget".into(),
        id: u64::MAX,
        delta: -5_000_000_000,
        count: -3,
        small: 7,
        ratio: 0.25,
        weight: 1.5,
        stamp: 0x0102_0304_0506_0708,
        offset: -9,
        signed_big: i64::MIN,
        flag: true,
        blob: vec![0, 1, 2, 250, 251],
        kind: Kind::Huge as i32,
        kinds: vec![Kind::Small as i32, Kind::Unknown as i32, Kind::Large as i32],
        tags: vec!["a".into(), String::new(), "é".into()],
        samples: vec![-1, 0, 1, i32::MIN],
        parts: vec![
            Part {
                label: "p0".into(),
                sizes: vec![1, 1 << 40],
                kind: Kind::Small as i32,
            },
            Part::default(),
        ],
        origin: Some(Part {
            label: "origin".into(),
            sizes: vec![],
            kind: Kind::Large as i32,
        }),
        note: Some(String::new()),
        limit: Some(0),
        crc: 0xdead_beef,
        wide: vec![i64::MAX, -1],
    };
    let value = json!({
        "name": "widget",
        "id": "18446744073709551615",
        "delta": "-5000000000",
        "count": -3,
        "small": 7,
        "ratio": 0.25,
        "weight": 1.5,
        "stamp": "72623859790382856",
        "offset": -9,
        "signedBig": "-9223372036854775808",
        "flag": true,
        "blob": "AAEC+vs=",
        "kind": "HUGE",
        "kinds": ["SMALL", "UNKNOWN", "LARGE"],
        "tags": ["a", "", "é"],
        "samples": [-1, 0, 1, -2147483648],
        "parts": [
            {"label": "p0", "sizes": ["1", "1099511627776"], "kind": "SMALL"},
            {"label": "", "sizes": [], "kind": "UNKNOWN"}
        ],
        "origin": {"label": "origin", "sizes": [], "kind": "LARGE"},
        "note": "",
        "limit": 0,
        "crc": 3735928559u32,
        "wide": ["9223372036854775807", "-1"],
    });
    (item, value)
}

#[test]
fn a_full_message_encodes_to_prosts_bytes_and_decodes_back() {
    let service = service();
    let (item, value) = full_item();
    let bytes = encode(&service, "Item", &value).unwrap();
    assert_eq!(bytes, item.encode_to_vec());
    assert_eq!(Item::decode(&bytes[..]).unwrap(), item);
    assert_eq!(decode(&service, "Item", &bytes).unwrap(), value);
}

#[test]
fn spec_names_numbers_and_yaml_spellings_are_accepted() {
    let service = service();
    let (item, _) = full_item();
    // Spec (snake_case) names, 64-bit integers as numbers, enums by number, URL-safe base64
    // without padding, keys in any order.
    let value = json!({
        "wide": [9223372036854775807i64, -1],
        "crc": "3735928559",
        "limit": 0,
        "note": "",
        "origin": {"label": "origin", "kind": 2},
        "parts": [{"label": "p0", "sizes": [1, 1099511627776u64], "kind": "SMALL"}, {}],
        "samples": [-1, 0, 1, -2147483648],
        "tags": ["a", "", "é"],
        "kinds": [1, "UNKNOWN", "Large"],
        "kind": 7,
        "blob": "AAEC-vs",
        "flag": true,
        "signed_big": "-9223372036854775808",
        "offset": "-9",
        "stamp": 72623859790382856u64,
        "weight": "1.5",
        "ratio": 0.25,
        "small": 7.0,
        "count": -3,
        "delta": -5000000000i64,
        "id": 18446744073709551615u64,
        "name": "widget",
    });
    assert_eq!(
        encode(&service, "Item", &value).unwrap(),
        item.encode_to_vec()
    );
}

#[test]
fn defaults_are_left_out_and_printed() {
    let service = service();
    assert!(encode(&service, "Item", &json!({})).unwrap().is_empty());
    // Zeros of singular fields and nulls are not sent; a present message is, even empty.
    let zeros = json!({"name": "", "id": "0", "kind": "UNKNOWN", "note": null, "origin": {}});
    let item = Item {
        origin: Some(Part::default()),
        ..Item::default()
    };
    assert_eq!(
        encode(&service, "Item", &zeros).unwrap(),
        item.encode_to_vec()
    );
    let printed = decode(&service, "Item", &[]).unwrap();
    assert_eq!(printed["id"], "0");
    assert_eq!(printed["ratio"], 0.0);
    assert_eq!(printed["kind"], "UNKNOWN");
    assert_eq!(printed["blob"], "");
    assert_eq!(printed["parts"], json!([]));
    assert_eq!(printed["origin"], Value::Null);
    assert_eq!(printed["note"], Value::Null);
    assert_eq!(printed.as_object().unwrap().len(), 22, "every field");
}

#[test]
fn floats_take_proto3_special_values() {
    let service = service();
    let value = json!({"ratio": "-Infinity", "weight": "NaN"});
    let bytes = encode(&service, "Item", &value).unwrap();
    let item = Item::decode(&bytes[..]).unwrap();
    assert_eq!(item.ratio, f64::NEG_INFINITY);
    assert!(item.weight.is_nan());
    let printed = decode(&service, "Item", &bytes).unwrap();
    assert_eq!(printed["ratio"], "-Infinity");
    assert_eq!(printed["weight"], "NaN");
    // A float prints as its shortest decimal.
    let bytes = Item {
        weight: 0.1,
        ..Item::default()
    }
    .encode_to_vec();
    assert_eq!(decode(&service, "Item", &bytes).unwrap()["weight"], 0.1);
}

fn error(value: Value) -> String {
    encode(&service(), "Item", &value).unwrap_err().to_string()
}

#[test]
fn errors_name_the_field_path() {
    assert_eq!(
        error(json!({"parts": [{}, {"lable": "x"}]})),
        "Item.parts[1]: message Part has no field `lable` (its fields: label, sizes, kind)"
    );
    assert_eq!(
        error(json!({"origin": {"kind": "MEDIUM"}})),
        "Item.origin.kind: enum Kind has no value `MEDIUM` (its values: UNKNOWN, SMALL, LARGE, \
         HUGE)"
    );
    assert_eq!(
        error(json!({"count": "three"})),
        "Item.count: expected an integer (int32), found a string \"three\""
    );
    assert_eq!(
        error(json!({"tags": "a"})),
        "Item.tags: expected an array (repeated string), found a string \"a\""
    );
    assert_eq!(
        error(json!({"origin": [1]})),
        "Item.origin: expected an object (message Part), found an array of 1"
    );
    assert_eq!(
        error(json!({"flag": 1})),
        "Item.flag: expected true or false, found the number 1"
    );
    assert_eq!(
        error(json!({"small": 1.5})),
        "Item.small: expected an integer (uint32), found the number 1.5"
    );
    assert_eq!(
        error(json!({"name": "a", "signed_big": 1, "signedBig": 2})),
        "Item.signed_big: given twice, as `signedBig` and as `signed_big`"
    );
    assert!(error(json!({"blob": "not base64!"}))
        .starts_with("Item.blob: expected a base64 string (bytes), found a string"));
}

#[test]
fn numbers_out_of_range_are_refused() {
    for (field, value, ty) in [
        ("small", json!(-1), "uint32"),
        ("count", json!(2147483648u64), "int32"),
        ("id", json!("18446744073709551616"), "uint64"),
        ("signed_big", json!(9223372036854775808u64), "int64"),
        ("samples", json!([0, -2147483649i64]), "sint32"),
        ("weight", json!(1e39), "float"),
        ("kind", json!(1u64 << 31), "enum"),
    ] {
        let message = error(json!({ field: value }));
        assert!(
            message.starts_with(&format!("Item.{field}"))
                && message.ends_with(&format!(" is out of range for {ty}")),
            "{message}"
        );
    }
}

#[test]
fn decoding_skips_unknown_fields_and_keeps_unknown_enum_numbers() {
    let service = service();
    let mut bytes = Item {
        kind: 5,
        ..Item::default()
    }
    .encode_to_vec();
    // Field 99, a varint the spec does not know.
    bytes.extend([0x98, 0x06, 0x01]);
    let printed = decode(&service, "Item", &bytes).unwrap();
    assert_eq!(printed["kind"], 5);
}

#[test]
fn repeated_numbers_decode_packed_or_not() {
    let service = service();
    // `samples` (16, sint32) as two unpacked records: -1 and 1 zig-zag to 1 and 2.
    let bytes = [0x80, 0x01, 0x01, 0x80, 0x01, 0x02];
    assert_eq!(
        decode(&service, "Item", &bytes).unwrap()["samples"],
        json!([-1, 1])
    );
}

#[test]
fn malformed_bytes_name_the_field() {
    let service = service();
    // `origin` (18) claims 5 bytes where 1 remains.
    let err = decode(&service, "Item", &[0x92, 0x01, 0x05, 0x00]).unwrap_err();
    assert!(
        matches!(&err, CodecError::Malformed { path, .. } if path == "Item.origin"),
        "{err}"
    );
    // `name` (1) as a varint: the wrong wire type.
    let err = decode(&service, "Item", &[0x08, 0x01]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Item.name: malformed message: "),
        "{err}"
    );
}

#[test]
fn remote_buffers_cannot_be_given() {
    let spec = r#"
version: "rdma-rpc/1"
service: Test
endpoints:
  - { path: /a, type: send, method: a, request: Offer }
messages:
  Offer:
    fields:
      - { name: window, type: remote_buffer }
"#;
    let service = rdma_rpc_codegen::parse_spec("offer.yaml", spec).unwrap();
    let err = encode(&service, "Offer", &json!({"window": {}})).unwrap_err();
    assert!(matches!(err, CodecError::RemoteBuffer { ref path } if path == "Offer.window"));
    assert_eq!(
        decode(&service, "Offer", &[]).unwrap(),
        json!({"window": null})
    );
}

#[test]
fn nesting_is_bounded() {
    let spec = r#"
version: "rdma-rpc/1"
service: Test
endpoints:
  - { path: /a, type: send, method: a, request: Node }
messages:
  Node:
    fields:
      - { name: next, type: Node }
"#;
    let service = rdma_rpc_codegen::parse_spec("node.yaml", spec).unwrap();
    let mut value = json!({});
    for _ in 0..super::MAX_DEPTH + 2 {
        value = json!({ "next": value });
    }
    let err = encode(&service, "Node", &value).unwrap_err();
    assert!(matches!(err, CodecError::TooDeep { .. }), "{err}");
    let mut bytes: Vec<u8> = Vec::new();
    for _ in 0..super::MAX_DEPTH + 2 {
        let mut outer = vec![0x0a];
        prost::encoding::encode_varint(bytes.len() as u64, &mut outer);
        outer.extend(bytes);
        bytes = outer;
    }
    let err = decode(&service, "Node", &bytes).unwrap_err();
    assert!(matches!(err, CodecError::TooDeep { .. }), "{err}");
}

#[test]
fn json_names_follow_protoc() {
    assert_eq!(json_name("min_version"), "minVersion");
    assert_eq!(json_name("type_"), "type");
    assert_eq!(json_name("field1_name"), "field1Name");
    assert_eq!(json_name("id"), "id");
}
