//! Credit accounting of one side of a connection, without I/O: how many frames it may send
//! into the peer's posted receives, and when it must tell the peer about receives it
//! re-posted. [`super::channel::FrameChannel`] drives it.
//!
//! Rules:
//! - a frame uses one credit (one receive of the peer);
//! - the last credit is kept for frames that unblock the peer (handshake, credit updates,
//!   goaway), so two sides that both ran out can always tell each other about re-posted
//!   receives;
//! - a peer is believed for at most the receives it announced (itself clamped to
//!   [`super::MAX_PEER_CREDITS`]): credits returned beyond that are ignored, so a lying peer
//!   cannot make this side queue frames it will never read;
//! - receives re-posted by this side are owed to the peer and travel with the next frame;
//!   once `announce_at` re-posted ones are owed and no frame carried them, a credit update
//!   is due. Receives *added* as the connection grows are owed too, but never make an update
//!   due by themselves: the peer is not waiting for them (it never had them), and counting
//!   them made every frame of a growing connection answer with an update of its own;
//! - receives grow only on the peer's demand: a side that had a frame waiting for a credit
//!   says so with its next frame (`Frame.starved`), and the receiver then doubles its
//!   receives (up to its ceiling, see [`Credits::growth`]) and owes the peer an update at
//!   once. A connection with one call at a time never grows; one that pipelines reaches the
//!   receives it needs in a few round trips.

/// Credits a side may use before the handshake told it the peer's receive count: the first
/// frame (Hello) always has a receive waiting.
pub(crate) const INITIAL_CREDITS: u32 = 1;

/// What a frame to send needs: an ordinary frame leaves the last credit alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Requests, responses, grants, acks: never the last credit.
    Ordinary,
    /// Handshake, credit updates, goaway: may use the last credit.
    Priority,
}

/// One side's credits.
#[derive(Debug, Clone)]
pub(crate) struct Credits {
    /// Frames this side may send now.
    available: u32,
    /// Most credits the peer can have given: its announced receives (clamped).
    cap: u32,
    /// Receives re-posted (or added) here and not yet announced to the peer.
    owed: u32,
    /// Of `owed`, the receives added (not re-posted).
    owed_added: u32,
    /// Owed credits that make an update due.
    announce_at: u32,
    /// Receives this side has posted.
    posted: u32,
    /// Most receives this side posts (what its handshake announced as its ceiling).
    max_posted: u32,
}

/// Owed credits that make an update due with `posted` receives: a quarter of them, and at
/// least two. Receiving an update makes its receiver owe one credit (the re-posted receive),
/// and sending one clears what the sender owed; with a threshold of one, two sides would
/// answer each other's updates forever. Liveness needs the threshold below `posted`: a side
/// blocked on its last credit means the peer owes at least `posted - 1`, which then made an
/// update due ([`MIN_RECEIVES`] keeps that true).
fn announce_at(posted: u32) -> u32 {
    (posted / 4).max(2)
}

/// Fewest receives a side may announce for ordinary frames (see [`announce_at`]).
pub(crate) const MIN_RECEIVES: u32 = 4;

/// Checks an `initial_receives` setting against the rules above and `recv_credits`.
pub(crate) fn check_initial(initial: u32, max: u32) -> crate::Result<()> {
    if (MIN_RECEIVES..=max).contains(&initial) {
        Ok(())
    } else {
        Err(crate::Error::InvalidArgument(format!(
            "initial_receives must be at least {MIN_RECEIVES} and at most recv_credits ({max}), \
             not {initial}"
        )))
    }
}

impl Credits {
    /// A side that posted `posted` receives and grows them on the peer's demand up to
    /// `max_posted`; `initial` holds for a client, whose Hello always finds a receive.
    pub(crate) fn new(posted: u32, max_posted: u32, initial: bool) -> Credits {
        Credits {
            available: if initial { INITIAL_CREDITS } else { 0 },
            cap: u32::MAX,
            owed: 0,
            owed_added: 0,
            announce_at: announce_at(posted),
            posted,
            max_posted: max_posted.max(posted),
        }
    }

    /// Receives to add because the peer said it was starved, with `pending` already decided
    /// and not yet posted: as many as there will be (the receives double), up to the ceiling.
    /// Growing by one per starved frame instead kept a pipelining peer short of credits for
    /// dozens of round trips, each a stall.
    pub(crate) fn growth(&self, pending: u32) -> u32 {
        let will = self.posted.saturating_add(pending);
        will.min(self.max_posted.saturating_sub(will))
    }

    /// One more receive was posted: the peer is owed a credit for it.
    pub(crate) fn grew(&mut self) {
        self.posted += 1;
        self.owed += 1;
        self.owed_added += 1;
        self.announce_at = announce_at(self.posted);
    }

    /// Receives this side has posted.
    #[cfg(test)]
    pub(crate) fn posted(&self) -> u32 {
        self.posted
    }

    /// Applies the peer's handshake: it announced `announced` receives, of which `usable` may
    /// be used now. Returns the credits that were ignored (a peer that claims more than it
    /// may).
    pub(crate) fn handshake(&mut self, usable: u32, announced: u32) -> u32 {
        self.cap = announced.min(super::MAX_PEER_CREDITS);
        self.returned(usable.min(self.cap))
    }

    /// The peer returned `n` credits. Returns how many were ignored because they would
    /// exceed what the peer announced.
    pub(crate) fn returned(&mut self, n: u32) -> u32 {
        let sum = self.available.saturating_add(n);
        let kept = sum.min(self.cap);
        let ignored = sum - kept;
        self.available = kept;
        ignored
    }

    /// Takes a credit for a frame, if one is free for it.
    pub(crate) fn try_take(&mut self, need: Need) -> bool {
        let floor = match need {
            Need::Ordinary => 1,
            Need::Priority => 0,
        };
        if self.available > floor {
            self.available -= 1;
            true
        } else {
            false
        }
    }

    /// Frames this side may send now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> u32 {
        self.available
    }

    /// A frame arrived and its receive was re-posted: the peer is owed one credit. Returns
    /// whether a credit update is due now (none of the frames sent since carried them).
    pub(crate) fn reposted(&mut self) -> bool {
        self.owed += 1;
        self.owed - self.owed_added >= self.announce_at
    }

    /// The credits owed to the peer, cleared: they travel with the frame being sent.
    pub(crate) fn take_owed(&mut self) -> u32 {
        self.owed_added = 0;
        std::mem::take(&mut self.owed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MAX_PEER_CREDITS;

    #[test]
    fn initial_receives_must_respect_the_liveness_floor_and_the_ceiling() {
        assert!(check_initial(4, 64).is_ok());
        assert!(check_initial(64, 64).is_ok());
        for (initial, max) in [(3, 64), (65, 64), (0, 4)] {
            let err = check_initial(initial, max).unwrap_err().to_string();
            assert!(err.contains("initial_receives"), "{err}");
        }
    }

    #[test]
    fn the_client_may_send_its_hello_before_the_handshake_and_the_server_nothing() {
        let mut client = Credits::new(64, 64, true);
        let mut server = Credits::new(64, 64, false);
        assert!(client.try_take(Need::Priority));
        assert!(!client.try_take(Need::Priority));
        assert!(!server.try_take(Need::Priority));
    }

    #[test]
    fn the_last_credit_is_kept_for_frames_that_unblock_the_peer() {
        let mut c = Credits::new(8, 8, false);
        c.handshake(3, 3);
        assert!(c.try_take(Need::Ordinary));
        assert!(c.try_take(Need::Ordinary));
        assert!(
            !c.try_take(Need::Ordinary),
            "starved: the last one is reserved"
        );
        assert!(c.try_take(Need::Priority));
        assert!(!c.try_take(Need::Priority));
        c.returned(1);
        assert!(!c.try_take(Need::Ordinary));
        assert!(c.try_take(Need::Priority));
    }

    #[test]
    fn a_peer_is_believed_only_for_the_receives_it_announced() {
        let mut c = Credits::new(8, 8, false);
        assert_eq!(
            c.handshake(10, 4),
            0,
            "usable beyond announced is clamped first"
        );
        assert_eq!(c.available(), 4);
        assert_eq!(c.returned(3), 3, "returned beyond the announced receives");
        assert_eq!(c.available(), 4);
        let mut greedy = Credits::new(8, 8, false);
        greedy.handshake(u32::MAX, u32::MAX);
        assert_eq!(greedy.available(), MAX_PEER_CREDITS);
        assert!(greedy.returned(u32::MAX) >= u32::MAX - MAX_PEER_CREDITS);
        assert_eq!(greedy.available(), MAX_PEER_CREDITS);
    }

    #[test]
    fn credit_updates_are_due_every_quarter_of_the_receives() {
        let mut c = Credits::new(16, 16, false);
        assert!(!c.reposted());
        assert!(!c.reposted());
        assert!(!c.reposted());
        assert!(c.reposted(), "4 of 16 owed");
        assert_eq!(c.take_owed(), 4);
        assert_eq!(c.take_owed(), 0, "owed credits travel once");
        let mut few = Credits::new(4, 4, false);
        assert!(!few.reposted());
        assert!(
            few.reposted(),
            "every second receive when there are few, never every one"
        );
    }

    /// Two sides that each used every ordinary credit can still unblock each other: each
    /// sends a credit update with its reserved last credit, and the updates restore the
    /// other's credits. A deterministic replay of the deadlock the reserve prevents.
    #[test]
    fn two_starved_sides_unblock_each_other() {
        let (mut a, mut b) = (Credits::new(4, 4, false), Credits::new(4, 4, false));
        a.handshake(4, 4);
        b.handshake(4, 4);
        // Each sends three ordinary frames; the other receives and re-posts them.
        for _ in 0..3 {
            assert!(a.try_take(Need::Ordinary));
            b.reposted();
            assert!(b.try_take(Need::Ordinary));
            a.reposted();
        }
        assert!(!a.try_take(Need::Ordinary) && !b.try_take(Need::Ordinary));
        // Both owe credits; the updates use the reserved credit.
        assert!(a.try_take(Need::Priority));
        let to_b = a.take_owed();
        assert!(b.try_take(Need::Priority));
        let to_a = b.take_owed();
        b.returned(to_b);
        a.returned(to_a);
        // The updates themselves were received and re-posted as well.
        b.reposted();
        a.reposted();
        assert!(a.try_take(Need::Ordinary), "a can send again");
        assert!(b.try_take(Need::Ordinary), "b can send again");
    }

    #[test]
    fn receives_double_on_demand_and_each_added_one_is_owed_to_the_peer() {
        let mut c = Credits::new(4, 12, false);
        assert_eq!(c.growth(0), 4, "the receives double");
        assert_eq!(c.growth(6), 2, "counting those decided and not yet posted");
        for _ in 0..4 {
            c.grew();
        }
        assert_eq!(c.growth(0), 4, "up to the ceiling");
        for _ in 0..4 {
            c.grew();
        }
        assert_eq!(c.posted(), 12);
        assert_eq!(c.growth(0), 0, "never beyond the announced ceiling");
        assert_eq!(c.take_owed(), 8, "a credit for every receive added");
        // Updates are due every quarter of the receives posted now (12 / 4).
        assert!(!c.reposted() && !c.reposted());
        assert!(c.reposted());
        assert_eq!(c.take_owed(), 3);
        let fixed = Credits::new(8, 4, false);
        assert_eq!(fixed.growth(0), 0, "a ceiling below the start is the start");
    }

    /// What one simulated side holds: its credits and the frames that reached its receives.
    struct Side {
        credits: Credits,
        /// Receives posted and not holding a frame.
        free: u32,
        /// A frame waited for a credit since this side's last frame.
        starved: bool,
        inbox: std::collections::VecDeque<(u32, bool, Sim)>,
    }

    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Sim {
        Hello,
        HelloAck,
        Update,
        Request,
        Response,
    }

    impl Side {
        fn new(initial: u32, max: u32, client: bool) -> Side {
            Side {
                credits: Credits::new(initial, max, client),
                free: initial,
                starved: false,
                inbox: Default::default(),
            }
        }
    }

    /// Sends a frame from `from` into a receive of `to`: a frame with no receive waiting for
    /// it is the failure the credits exist to prevent.
    fn deliver(from: &mut Side, to: &mut Side, kind: Sim) {
        assert!(to.free > 0, "{kind:?} sent with no receive posted");
        to.free -= 1;
        let owed = from.credits.take_owed();
        let starved = std::mem::take(&mut from.starved);
        to.inbox.push_back((owed, starved, kind));
    }

    /// Sends an ordinary frame if a credit allows; otherwise `from` is starved, and says so
    /// with its next frame.
    fn try_send(from: &mut Side, to: &mut Side, kind: Sim) -> bool {
        let ok = from.credits.try_take(Need::Ordinary);
        if ok {
            deliver(from, to, kind);
        } else {
            from.starved = true;
        }
        ok
    }

    /// Takes the next frame from `me`'s receives, as `protocol::connection` does: re-post,
    /// apply the credits, grow if the sender was starved, and send a credit update if one is
    /// due (at once after growing).
    fn receive(me: &mut Side, peer: &mut Side) -> Option<Sim> {
        let (credits, starved, kind) = me.inbox.pop_front()?;
        me.free += 1;
        me.credits.returned(credits);
        let growth = if starved { me.credits.growth(0) } else { 0 };
        for _ in 0..growth {
            me.free += 1;
            me.credits.grew();
        }
        let due = me.credits.reposted() || growth > 0;
        if due && me.credits.try_take(Need::Priority) {
            deliver(me, peer, Sim::Update);
        }
        Some(kind)
    }

    /// A client and a server whose receives start at 4 and may grow to 64, after the handshake
    /// as both run it.
    fn handshaken() -> (Side, Side) {
        let mut client = Side::new(4, 64, true);
        let mut server = Side::new(4, 64, false);
        assert!(client.credits.try_take(Need::Priority));
        deliver(&mut client, &mut server, Sim::Hello);
        assert_eq!(receive(&mut server, &mut client), Some(Sim::Hello));
        server.credits.handshake(4, 64);
        assert!(server.credits.try_take(Need::Priority));
        deliver(&mut server, &mut client, Sim::HelloAck);
        // The client applies the HelloAck's credits in `recv`, then the handshake.
        assert_eq!(receive(&mut client, &mut server), Some(Sim::HelloAck));
        client.credits.handshake(4 - 1, 64);
        (client, server)
    }

    /// A client and a server whose receives start at 4 and grow to 64 exchange 2,000 calls, up
    /// to 16 in flight, in a pseudo-random but fixed interleaving of every step each side may
    /// take. No frame ever finds no receive, and the exchange never stalls with calls left.
    #[test]
    fn growing_receives_never_overrun_and_never_stall_a_simulated_connection() {
        for seed in 1..=20u64 {
            let (mut client, mut server) = handshaken();
            let mut rng = seed;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };

            let (mut to_send, mut in_flight, mut answered, mut to_answer) = (2000u32, 0u32, 0, 0);
            let mut idle_rounds = 0;
            while answered < 2000 {
                let progressed = match next() % 4 {
                    0 if to_send > 0 && in_flight < 16 => {
                        let ok = try_send(&mut client, &mut server, Sim::Request);
                        if ok {
                            to_send -= 1;
                            in_flight += 1;
                        }
                        ok
                    }
                    1 if to_answer > 0 => {
                        let ok = try_send(&mut server, &mut client, Sim::Response);
                        if ok {
                            to_answer -= 1;
                        }
                        ok
                    }
                    2 => match receive(&mut server, &mut client) {
                        Some(Sim::Request) => {
                            to_answer += 1;
                            true
                        }
                        other => other.is_some(),
                    },
                    3 => match receive(&mut client, &mut server) {
                        Some(Sim::Response) => {
                            in_flight -= 1;
                            answered += 1;
                            true
                        }
                        other => other.is_some(),
                    },
                    _ => false,
                };
                idle_rounds = if progressed { 0 } else { idle_rounds + 1 };
                assert!(
                    idle_rounds < 1000,
                    "seed {seed}: stalled with {answered} answered, {in_flight} in flight, \
                     client {:?}, server {:?}",
                    client.credits,
                    server.credits
                );
            }
            // 16 requests in flight need 17 credits (the last is kept): the server grew on
            // the client's demand, by doubling, never beyond its ceiling.
            let grown = server.credits.posted();
            assert!(
                (32..=64).contains(&grown),
                "seed {seed}: the server has {grown} receives"
            );
            assert!(client.credits.posted() <= 64);
        }
    }

    /// One call at a time on a connection whose receives may grow from 4 to 64: every frame
    /// carries the credits its sender owes, so no credit update is ever due, and no side is
    /// ever starved, so neither grows.
    #[test]
    fn a_connection_with_one_call_at_a_time_neither_grows_nor_sends_a_credit_update() {
        let (mut client, mut server) = handshaken();
        for call in 0..200 {
            assert!(client.credits.try_take(Need::Ordinary), "call {call}");
            deliver(&mut client, &mut server, Sim::Request);
            assert_eq!(receive(&mut server, &mut client), Some(Sim::Request));
            assert!(
                client.inbox.is_empty(),
                "call {call}: the server sent an update"
            );
            assert!(server.credits.try_take(Need::Ordinary), "call {call}");
            deliver(&mut server, &mut client, Sim::Response);
            assert_eq!(receive(&mut client, &mut server), Some(Sim::Response));
            assert!(
                server.inbox.is_empty(),
                "call {call}: the client sent an update"
            );
        }
        assert_eq!(client.credits.posted(), 4, "no demand, no growth");
        assert_eq!(server.credits.posted(), 4);
    }

    /// Two idle sides that exchange credit updates stop: an update makes its receiver owe
    /// one credit, never enough for an update of its own.
    #[test]
    fn credit_updates_never_answer_each_other_forever() {
        let mut a = Side::new(4, 64, false);
        let mut b = Side::new(4, 64, false);
        a.credits.handshake(4, 64);
        b.credits.handshake(4, 64);
        // `a` owes enough for an update and sends it.
        a.credits.reposted();
        assert!(a.credits.reposted());
        assert!(a.credits.try_take(Need::Priority));
        deliver(&mut a, &mut b, Sim::Update);
        let mut frames = 0;
        while receive(&mut b, &mut a)
            .or_else(|| receive(&mut a, &mut b))
            .is_some()
        {
            frames += 1;
            assert!(frames < 10, "updates answered each other {frames} times");
        }
    }
}
