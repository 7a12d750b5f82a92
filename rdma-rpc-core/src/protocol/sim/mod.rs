//! Deterministic simulation of the protocol: a client's and a server's
//! [`Connection`](super::connection::Connection) wired through a simulated link, driven by a
//! seeded schedule, with no transport, runtime or clock of their own (quinn-proto's tests
//! drive a `Pair` of connections the same way).
//!
//! The link keeps what the protocol relies on from an RDMA reliable connection and nothing
//! more: frames arrive in the order they were sent in each direction, each into a receive its
//! receiver posted beforehand (a frame that finds none is the receiver-not-ready the credits
//! exist to prevent, and fails the run); the two directions interleave in any order, frames
//! stay in flight for as long as the schedule likes, and the link may fail at any moment (both
//! sides then see the connection lost, and every frame in flight is gone).
//!
//! Each run checks, whatever the schedule did:
//! - every call the client opened ends exactly once (a response, the connection's end, or its
//!   deadline), and every call the server started is answered at most once;
//! - a call whose deadline passed is woken by the client's one timer, never told before the
//!   deadline, and the timer is never set later than the deadline of a call still waiting;
//!   a client never reads the clock to handle a frame;
//! - no frame ever finds no receive (credits never promise more than is posted);
//! - an honest client never names a write slot the server has not armed for it, and never
//!   gets a slot refused;
//! - the windows of a call the client gave up on stay up until the server answered that call
//!   (or the connection ended);
//! - a revocation is confirmed only once the holder's uses of the offer ended, and the holder
//!   refuses new uses from the moment it learned of it;
//! - a server that shuts down answers every call it started, refuses what comes after, and
//!   ends the connection once they are answered; every answer reaches the client, however
//!   short of credits the server was when it decided to end;
//! - a hostile client's frames end its connection with an error, never a panic.
//!
//! A failing seed is printed; `SIM_SEED=<seed> cargo test -p rdma-rpc-core --lib sim` replays
//! it alone.

#[cfg(test)]
mod hostile;
mod link;
mod model;
mod rng;

#[cfg(test)]
mod tests;
