//! The validated intermediate representation of a service: plain Rust data with every name
//! already turned into its Rust spelling and every default applied. Nothing here refers to
//! YAML; the generator works from these types only.

use std::fmt;
use std::time::Duration;

/// A validated service: what one spec file describes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceIr {
    /// The spec file as it was named to [`crate::load_spec`] or [`crate::parse_spec`]; the
    /// header of generated code names its last component.
    pub source: String,
    /// The service name in UpperCamelCase (`KvStore`); the generated trait has this name,
    /// and the server and client are `<name>Server` and `<name>Client`.
    pub name: String,
    /// The service's documentation, if the spec has one.
    pub doc: Option<String>,
    /// Which spec format the file used.
    pub format: SpecFormat,
    /// The endpoints, in spec order.
    pub endpoints: Vec<EndpointIr>,
    /// The messages defined in the spec, in spec order.
    pub messages: Vec<MessageIr>,
    /// The enums defined in the spec, in spec order.
    pub enums: Vec<EnumIr>,
}

impl ServiceIr {
    /// The message with this name, if the spec defines one.
    pub fn message(&self, name: &str) -> Option<&MessageIr> {
        self.messages.iter().find(|m| m.name == name)
    }

    /// The enum with this name, if the spec defines one.
    pub fn enumeration(&self, name: &str) -> Option<&EnumIr> {
        self.enums.iter().find(|e| e.name == name)
    }
}

/// The two accepted spec formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SpecFormat {
    /// The doca-cpp endpoint list, `version: "0.0.1"`.
    DocaCpp,
    /// The extended format, `version: "rdma-rpc/1"`.
    Extended,
}

impl SpecFormat {
    /// The `version` string that selects this format.
    pub fn version(self) -> &'static str {
        match self {
            SpecFormat::DocaCpp => "0.0.1",
            SpecFormat::Extended => "rdma-rpc/1",
        }
    }
}

/// One endpoint: an operation on a path, with its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointIr {
    /// The endpoint path, e.g. `/rdma/ep0`; sent on the wire to select the endpoint.
    pub path: String,
    /// The operation, named from the client's side.
    pub op: OpKind,
    /// The size in bytes of the buffer registered for this endpoint.
    pub buffer_size: u64,
    /// The Rust method name, snake_case (`rdma_ep0_receive`, `put_block`).
    pub method: String,
    /// The method's documentation, if the spec has one.
    pub doc: Option<String>,
    /// The message the client sends with the request, if typed; when the client streams
    /// its requests ([`StreamKind::Messages`] with `requests`), the type of each message of
    /// its stream.
    pub request: Option<TypeRef>,
    /// The message the server answers with, if typed; when the server streams its responses
    /// ([`StreamKind::Messages`] with `responses`), the type of each message of its stream.
    pub response: Option<TypeRef>,
    /// How long the client waits for the operation before giving up; `None` means the
    /// runtime's default.
    pub timeout: Option<Duration>,
    /// Whether calls move bytes besides their messages: a send's or write's data, a
    /// receive's or read's result bytes. Without, generated methods take and return messages
    /// only. Always `false` for message streams.
    pub payload: bool,
    /// Whether and how calls stream; always a kind the operation carries.
    pub stream: StreamKind,
}

impl EndpointIr {
    /// The type of each message the client streams, if it streams its requests.
    pub fn request_stream(&self) -> Option<&TypeRef> {
        self.stream
            .streams_requests()
            .then_some(self.request.as_ref())
            .flatten()
    }

    /// The type of each message the server streams, if it streams its responses.
    pub fn response_stream(&self) -> Option<&TypeRef> {
        self.stream
            .streams_responses()
            .then_some(self.response.as_ref())
            .flatten()
    }
}

/// Whether and how an endpoint's calls stream (`stream:` on write and read endpoints,
/// `request: { stream: .. }` / `response: { stream: .. }` on send and receive endpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StreamKind {
    /// One request message, one response message, and at most one buffer of bytes.
    #[default]
    Unary,
    /// A write or read whose payload moves in chunks of at most the buffer size, several in
    /// flight, up to `max_len` bytes in all.
    Bulk {
        /// The most bytes one call moves; at least the buffer size.
        max_len: u64,
    },
    /// A send or receive that carries a stream of messages one way or both, and no payload.
    Messages {
        /// The client streams its request messages.
        requests: bool,
        /// The server streams its response messages.
        responses: bool,
    },
}

impl StreamKind {
    /// Whether calls stream at all.
    pub fn is_streaming(self) -> bool {
        self != StreamKind::Unary
    }

    /// A bulk stream's `max_len`, if this is one.
    pub fn max_len(self) -> Option<u64> {
        match self {
            StreamKind::Bulk { max_len } => Some(max_len),
            _ => None,
        }
    }

    /// Whether the client streams request messages.
    pub fn streams_requests(self) -> bool {
        matches!(self, StreamKind::Messages { requests: true, .. })
    }

    /// Whether the server streams response messages.
    pub fn streams_responses(self) -> bool {
        matches!(
            self,
            StreamKind::Messages {
                responses: true,
                ..
            }
        )
    }
}

/// An operation type, named from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// The client sends a message to the server (two-sided).
    Send,
    /// The client asks and the server sends a message back (two-sided).
    Receive,
    /// The client RDMA-writes bytes into the endpoint's server buffer (one-sided).
    Write,
    /// The client RDMA-reads bytes from the endpoint's server buffer (one-sided).
    Read,
}

impl OpKind {
    /// All operation types, in opcode order.
    pub const ALL: [OpKind; 4] = [OpKind::Send, OpKind::Receive, OpKind::Write, OpKind::Read];

    /// The spelling used in specs (`send`, `receive`, `write`, `read`).
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::Receive => "receive",
            OpKind::Write => "write",
            OpKind::Read => "read",
        }
    }

    /// Parses the spec spelling; exact and lowercase only.
    pub fn from_spec(s: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|op| op.as_str() == s)
    }

    /// Whether the payload moves by a one-sided RDMA operation (write, read).
    pub fn is_one_sided(self) -> bool {
        matches!(self, OpKind::Write | OpKind::Read)
    }

    /// Whether bytes flow from the client to the server (send, write).
    pub fn is_inbound(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Write)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The type of a message field, or of an endpoint's request or response (always
/// [`TypeRef::Message`] there).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TypeRef {
    /// A protobuf scalar.
    Scalar(ScalarType),
    /// A message defined in the same spec, by its Rust name.
    Message(String),
    /// An enum defined in the same spec, by its Rust name.
    Enum(String),
    /// A handle to a window of the peer's memory (`remote_buffer` in specs), generated as
    /// `rdma_rpc_core::RemoteBuf`: the receiver reads, writes or updates that memory with
    /// one-sided operations.
    RemoteBuffer,
}

/// The spec spelling of [`TypeRef::RemoteBuffer`].
pub const REMOTE_BUFFER: &str = "remote_buffer";

impl TypeRef {
    /// The message or enum name, or the scalar's protobuf spelling.
    pub fn name(&self) -> &str {
        match self {
            TypeRef::Scalar(s) => s.as_str(),
            TypeRef::Message(name) | TypeRef::Enum(name) => name,
            TypeRef::RemoteBuffer => REMOTE_BUFFER,
        }
    }
}

/// The protobuf scalar types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // Each variant is the protobuf type of the same name.
pub enum ScalarType {
    Double,
    Float,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Bool,
    String,
    Bytes,
}

impl ScalarType {
    /// All scalar types, in protobuf documentation order.
    pub const ALL: [ScalarType; 15] = [
        ScalarType::Double,
        ScalarType::Float,
        ScalarType::Int32,
        ScalarType::Int64,
        ScalarType::Uint32,
        ScalarType::Uint64,
        ScalarType::Sint32,
        ScalarType::Sint64,
        ScalarType::Fixed32,
        ScalarType::Fixed64,
        ScalarType::Sfixed32,
        ScalarType::Sfixed64,
        ScalarType::Bool,
        ScalarType::String,
        ScalarType::Bytes,
    ];

    /// The protobuf spelling (`uint64`, `bytes`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ScalarType::Double => "double",
            ScalarType::Float => "float",
            ScalarType::Int32 => "int32",
            ScalarType::Int64 => "int64",
            ScalarType::Uint32 => "uint32",
            ScalarType::Uint64 => "uint64",
            ScalarType::Sint32 => "sint32",
            ScalarType::Sint64 => "sint64",
            ScalarType::Fixed32 => "fixed32",
            ScalarType::Fixed64 => "fixed64",
            ScalarType::Sfixed32 => "sfixed32",
            ScalarType::Sfixed64 => "sfixed64",
            ScalarType::Bool => "bool",
            ScalarType::String => "string",
            ScalarType::Bytes => "bytes",
        }
    }

    /// Parses the protobuf spelling.
    pub fn from_spec(s: &str) -> Option<ScalarType> {
        ScalarType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The Rust type prost uses for a singular field of this type.
    pub fn rust_type(self) -> &'static str {
        match self {
            ScalarType::Double => "f64",
            ScalarType::Float => "f32",
            ScalarType::Int32 | ScalarType::Sint32 | ScalarType::Sfixed32 => "i32",
            ScalarType::Int64 | ScalarType::Sint64 | ScalarType::Sfixed64 => "i64",
            ScalarType::Uint32 | ScalarType::Fixed32 => "u32",
            ScalarType::Uint64 | ScalarType::Fixed64 => "u64",
            ScalarType::Bool => "bool",
            ScalarType::String => "String",
            ScalarType::Bytes => "Vec<u8>",
        }
    }
}

/// A message, generated as a prost struct.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageIr {
    /// The struct name, UpperCamelCase.
    pub name: String,
    /// The message's documentation.
    pub doc: Option<String>,
    /// The fields, in spec order.
    pub fields: Vec<FieldIr>,
}

/// One field of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FieldIr {
    /// The field name, snake_case.
    pub name: String,
    /// The protobuf field number, unique in the message.
    pub tag: u32,
    /// The field's type.
    pub ty: TypeRef,
    /// Singular, optional or repeated.
    pub label: FieldLabel,
    /// The field's documentation.
    pub doc: Option<String>,
}

/// How many values a field holds (protobuf's field label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldLabel {
    /// Exactly one value; scalars and enums default to zero, messages are `Option` in prost.
    Singular,
    /// Explicit presence (`optional` in proto3): `Option<T>`.
    Optional,
    /// Zero or more values: `Vec<T>`.
    Repeated,
}

/// An enum, generated as a prost enumeration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnumIr {
    /// The enum name, UpperCamelCase.
    pub name: String,
    /// The enum's documentation.
    pub doc: Option<String>,
    /// The values, in spec order; the first has number 0.
    pub values: Vec<EnumValueIr>,
}

/// One value of an enum.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnumValueIr {
    /// The name as written in the spec (`NOT_FOUND` or `NotFound`).
    pub spec_name: String,
    /// The Rust variant name, UpperCamelCase (`NotFound`).
    pub name: String,
    /// The protobuf enum number, unique in the enum.
    pub number: i32,
    /// The value's documentation.
    pub doc: Option<String>,
}
