//! Credit-based flow control, sans-IO: no descriptors, no clock, only counts in and
//! immediate data out. The tokio driver feeds it what the completion queue says, posts the
//! receives it asks for, and posts what it decides.
//!
//! Every message is a SEND with immediate data, and consumes one receive at the peer:
//!
//! ```text
//!  31 30 | 29 ........ 15 | 14 ........ 0
//!  kind  |   data grants  | ctrl returns      (both cumulative, modulo 2^15)
//! ```
//!
//! - `kind` 0 is a data message, 1 a credit update, 2 the close message (`FIN`); 3 is invalid.
//! - A data message needs a **data credit**. The receiver grants them: `initial` at the
//!   handshake (see [`Handshake`]), then one per receive it posts for data, each posted
//!   *before* it is granted. Grants travel as a cumulative count; a sender whose credits would
//!   exceed the peer's `data_slots` (the most it ever has out) is told off
//!   ([`ProtocolError::OverReturn`]).
//! - The receiver keeps the credits it has out (granted, not yet arrived) at its **window**:
//!   `initial` at first, doubled (up to `data_slots`) each time a data message arrives that
//!   leaves the peer with no credit it knows of. It grants ahead of consumption, but never so
//!   that credits out plus data messages the application holds exceed `data_slots`: a slow
//!   reader still stops its sender. So a connection quiet since its start holds `initial` data
//!   receives, and a busy one up to `data_slots`; after a quiet while
//!   ([`Credits::quiet`]) the window starts again from `initial`, and the receives the peer
//!   uses are granted again only up to it (those granted stay posted until used: a receive
//!   cannot be taken back).
//! - Credit updates and `FIN` draw on a separate budget of `ctrl_slots`: the receiver posts a
//!   control message's receive again as soon as it has read it, so data can never starve them.
//!   The last control credit is kept for a pure confirmation (returning the peer's control
//!   credits), which is what keeps two sides that both ran out of control credits live.
//! - Grants and returns travel in every message's immediate data (piggybacked on data when
//!   there is some). A credit update goes on its own when half the window (at least 2) is
//!   granted and not yet told, or when the peer has no data credit it knows of and at least
//!   one is granted, or when two or more control credits are to be confirmed.
//!
//! The safety property, checked by the property tests: the messages in flight toward a side
//! never exceed the receives it has posted — no receiver-not-ready, however slow the reader.
//! Liveness: when both applications consume what they get, everything sent is delivered and
//! nothing waits forever.

use super::handshake::Handshake;

/// Bits of each cumulative counter.
const CUM_BITS: u32 = 15;
const CUM_MASK: u32 = (1 << CUM_BITS) - 1;

/// The kind of a message, from its immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Application data.
    Data,
    /// A credit update (no payload).
    Credit,
    /// The sender will send no more (no payload).
    Fin,
}

impl Kind {
    fn code(self) -> u32 {
        match self {
            Kind::Data => 0,
            Kind::Credit => 1,
            Kind::Fin => 2,
        }
    }
}

/// A peer broke the protocol; the connection is dropped, other connections are unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A message without immediate data from an evchan peer.
    #[error("a message without immediate data from an evchan peer")]
    NoImmediate,
    /// Kind 3 in the immediate data.
    #[error("message kind 3 is not defined")]
    BadKind,
    /// A data message beyond the credits this side granted.
    #[error("the peer sent a data message without a credit ({held} held, {slots} granted)")]
    NoCredit {
        /// Data messages held by this side.
        held: u32,
        /// Data slots this side offered.
        slots: u32,
    },
    /// The peer granted more data credits than its handshake's `data_slots` allow (with
    /// those this side holds), or confirmed more control messages than were outstanding.
    #[error("the peer returned {returned} credits, but only {outstanding} were outstanding")]
    OverReturn {
        /// What the update grants or confirms.
        returned: u32,
        /// What it could grant or confirm at most.
        outstanding: u32,
    },
    /// Data, or a second `FIN`, after the peer's `FIN` (credit updates may still come: the
    /// peer still reads).
    #[error("a message after the peer's close")]
    AfterFin,
    /// A data message larger than this side's receives (the receive would have failed).
    #[error("a message of {len} bytes, above the {max} B maximum")]
    TooLarge {
        /// Its length.
        len: u32,
        /// The maximum.
        max: u32,
    },
    /// A message larger than this side's receives: the receive failed with a local length
    /// error (`IBV_WC_LOC_LEN_ERR`) and the QP went to the error state. Its length is unknown.
    #[error("a message above the {max} B maximum overran its receive (local length error)")]
    Overrun {
        /// The maximum.
        max: u32,
    },
}

/// One side's credit state.
#[derive(Debug, Clone)]
pub struct Credits {
    mine: Handshake,
    peer: Handshake,
    /// Data credits the peer granted that we have not used.
    credits: u32,
    /// Our control messages the peer has not confirmed yet.
    ctrl_out: u32,
    /// The peer's last cumulative counts.
    peer_data_cum: u32,
    peer_ctrl_cum: u32,
    /// Data credits we granted that have not arrived as messages (held by the peer, in
    /// flight, or not yet told): each has its receive posted.
    granted: u32,
    /// What `granted` is kept at (see the module's docs).
    window: u32,
    /// Data messages received and not yet consumed.
    data_held: u32,
    /// Cumulative: data credits granted beyond the handshake's; control receives posted again.
    grants: u32,
    ctrl_returned: u32,
    /// The cumulative counts last sent to the peer.
    data_advertised: u32,
    ctrl_advertised: u32,
    fin_sent: bool,
    fin_received: bool,
}

fn delta(new: u32, old: u32) -> u32 {
    new.wrapping_sub(old) & CUM_MASK
}

impl Credits {
    /// The state right after the handshake: `mine` is what this side offered (its `initial`
    /// data receives and its control receives posted), `peer` what the peer did.
    #[must_use]
    pub fn new(mine: Handshake, peer: Handshake) -> Self {
        Self {
            mine,
            peer,
            credits: peer.initial,
            ctrl_out: 0,
            peer_data_cum: 0,
            peer_ctrl_cum: 0,
            granted: mine.initial,
            window: mine.initial,
            data_held: 0,
            grants: 0,
            ctrl_returned: 0,
            data_advertised: 0,
            ctrl_advertised: 0,
            fin_sent: false,
            fin_received: false,
        }
    }

    /// The peer's handshake.
    #[must_use]
    pub fn peer(&self) -> Handshake {
        self.peer
    }

    /// Data credits left (the peer's data receives we may still fill).
    #[must_use]
    pub fn data_credits(&self) -> u32 {
        self.credits
    }

    /// Whether a data message may be sent now.
    #[must_use]
    pub fn can_send_data(&self) -> bool {
        !self.fin_sent && self.credits > 0
    }

    fn imm(&mut self, kind: Kind) -> u32 {
        self.data_advertised = self.grants;
        self.ctrl_advertised = self.ctrl_returned;
        (kind.code() << (2 * CUM_BITS))
            | ((self.grants & CUM_MASK) << CUM_BITS)
            | (self.ctrl_returned & CUM_MASK)
    }

    /// Takes a data credit: the immediate data of the next data message. `None` without a
    /// credit (or after our `FIN`).
    pub fn send_data(&mut self) -> Option<u32> {
        if !self.can_send_data() {
            return None;
        }
        self.credits -= 1;
        Some(self.imm(Kind::Data))
    }

    /// Grants not yet told to the peer.
    fn pending_data(&self) -> u32 {
        delta(self.grants, self.data_advertised)
    }

    fn pending_ctrl(&self) -> u32 {
        delta(self.ctrl_returned, self.ctrl_advertised)
    }

    /// Whether the peer, once everything in flight has arrived, has no data credit it knows
    /// of.
    fn peer_blocked(&self) -> bool {
        self.granted <= self.pending_data()
    }

    /// How many receives for data the caller should post now (then call
    /// [`granted`](Self::granted) with how many it did): what brings the credits out up to
    /// the window, while credits out and data held stay within `data_slots`. None after the
    /// peer's `FIN`.
    #[must_use]
    pub fn receives_wanted(&self) -> u32 {
        if self.fin_received {
            return 0;
        }
        let room = self.mine.data_slots.saturating_sub(self.data_held);
        self.window.min(room).saturating_sub(self.granted)
    }

    /// `n` more receives for data are posted: as many credits granted (told to the peer with
    /// the next message).
    pub fn granted(&mut self, n: u32) {
        self.granted += n;
        self.grants = self.grants.wrapping_add(n) & CUM_MASK;
    }

    /// The connection was quiet for a while: the window goes back to the initial grant, so
    /// that the receives the peer uses from now on are granted again only up to it (those
    /// granted already stay posted: a receive cannot be taken back). It widens again as
    /// before when the peer's messages use every credit it knows of.
    pub fn quiet(&mut self) {
        self.window = self.mine.initial;
    }

    /// A credit update that should go now, as its immediate data (the caller posts it);
    /// `None` when none is due or the control budget is spent.
    pub fn credit_update(&mut self) -> Option<u32> {
        let data = self.pending_data();
        let grants_data = data >= (self.window / 2).max(2) || (data >= 1 && self.peer_blocked());
        let confirms = self.pending_ctrl() >= 2;
        let allowed = (grants_data && self.ctrl_spare())
            || (confirms && self.ctrl_out < u32::from(self.peer.ctrl_slots));
        allowed.then(|| self.send_ctrl(Kind::Credit))
    }

    /// A credit update that tells the peer the grants it has not been told yet, whatever the
    /// thresholds of [`credit_update`](Self::credit_update), as its immediate data; `None`
    /// when there are none or no control credit is free besides the confirmation reserve. The
    /// driver's backstop at its periodic look: a grant never waits longer than that.
    pub fn grant_update(&mut self) -> Option<u32> {
        (self.pending_data() > 0 && self.ctrl_spare()).then(|| self.send_ctrl(Kind::Credit))
    }

    /// A keepalive: a credit update that returns nothing new (the peer accepts it as one, and
    /// confirms it like any control message), as its immediate data. `None` when the control
    /// budget, less the confirmation reserve, is spent for now.
    pub fn keepalive(&mut self) -> Option<u32> {
        self.ctrl_spare().then(|| self.send_ctrl(Kind::Credit))
    }

    /// The `FIN` message's immediate data, once; `None` when sent already or the control budget
    /// (less the confirmation reserve) is spent for now.
    pub fn send_fin(&mut self) -> Option<u32> {
        if self.fin_sent || !self.ctrl_spare() {
            return None;
        }
        self.fin_sent = true;
        Some(self.send_ctrl(Kind::Fin))
    }

    /// Whether a control credit is free besides the one kept for confirmations (which only a
    /// credit update that confirms may take).
    fn ctrl_spare(&self) -> bool {
        self.ctrl_out + 1 < u32::from(self.peer.ctrl_slots)
    }

    /// Spends a control credit on a message of `kind`; its immediate data.
    fn send_ctrl(&mut self, kind: Kind) -> u32 {
        self.ctrl_out += 1;
        self.imm(kind)
    }

    /// Whether our `FIN` went out.
    #[must_use]
    pub fn fin_sent(&self) -> bool {
        self.fin_sent
    }

    /// Whether the peer's `FIN` came.
    #[must_use]
    pub fn fin_received(&self) -> bool {
        self.fin_received
    }

    /// A message arrived with immediate data `imm` and `len` bytes. For [`Kind::Data`] the
    /// caller hands it to the application and calls [`consumed`](Self::consumed) once it is
    /// done with it; control messages count as posted again at once (the caller must repost
    /// their receives before it sends anything). Then the caller posts the
    /// [`receives_wanted`](Self::receives_wanted).
    ///
    /// # Errors
    /// [`ProtocolError`] when the peer broke the protocol; the state is then unspecified and
    /// the connection must go.
    pub fn on_receive(&mut self, imm: Option<u32>, len: u32) -> Result<Kind, ProtocolError> {
        let imm = imm.ok_or(ProtocolError::NoImmediate)?;
        let kind = match imm >> (2 * CUM_BITS) {
            0 => Kind::Data,
            1 => Kind::Credit,
            2 => Kind::Fin,
            _ => return Err(ProtocolError::BadKind),
        };
        let data_cum = (imm >> CUM_BITS) & CUM_MASK;
        let ctrl_cum = imm & CUM_MASK;
        let granted = delta(data_cum, self.peer_data_cum);
        let room = self.peer.data_slots - self.credits;
        if granted > room {
            return Err(ProtocolError::OverReturn {
                returned: granted,
                outstanding: room,
            });
        }
        let confirmed = delta(ctrl_cum, self.peer_ctrl_cum);
        if confirmed > self.ctrl_out {
            return Err(ProtocolError::OverReturn {
                returned: confirmed,
                outstanding: self.ctrl_out,
            });
        }
        if self.fin_received && kind != Kind::Credit {
            return Err(ProtocolError::AfterFin);
        }
        match kind {
            Kind::Data => {
                if len > self.mine.max_message {
                    return Err(ProtocolError::TooLarge {
                        len,
                        max: self.mine.max_message,
                    });
                }
                if self.granted == 0 {
                    return Err(ProtocolError::NoCredit {
                        held: self.data_held,
                        slots: self.mine.data_slots,
                    });
                }
                self.granted -= 1;
                self.data_held += 1;
                if self.peer_blocked() {
                    // The peer used every credit it knew of: a wider window.
                    self.window = (self.window * 2).min(self.mine.data_slots);
                }
            }
            Kind::Credit | Kind::Fin => {
                // A credit update after the FIN (the peer still reads) leaves it received.
                self.fin_received |= kind == Kind::Fin;
                self.ctrl_returned = self.ctrl_returned.wrapping_add(1) & CUM_MASK;
            }
        }
        self.credits += granted;
        self.ctrl_out -= confirmed;
        self.peer_data_cum = data_cum;
        self.peer_ctrl_cum = ctrl_cum;
        Ok(kind)
    }

    /// The application is done with one data message (its receive buffer is free).
    pub fn consumed(&mut self) {
        debug_assert!(self.data_held > 0, "consumed more than received");
        self.data_held = self.data_held.saturating_sub(1);
    }

    /// Data messages held by the application.
    #[must_use]
    pub fn data_held(&self) -> u32 {
        self.data_held
    }

    /// Data credits granted to the peer that have not arrived as messages: the receives for
    /// data this side must keep posted.
    #[must_use]
    pub fn data_granted(&self) -> u32 {
        self.granted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// A handshake granting one data credit at first (the window grows from there).
    fn hs(data: u32, ctrl: u16) -> Handshake {
        Handshake {
            initial: 1,
            data_slots: data,
            ctrl_slots: ctrl,
            max_message: 64,
        }
    }

    /// One side of a simulated connection: its credits, what its application wants to send,
    /// what it holds unconsumed, what it received.
    struct Side {
        credits: Credits,
        to_send: u32,
        next_seq: u32,
        held: VecDeque<u32>,
        delivered: Vec<u32>,
        fin_wanted: bool,
        fin_seen: bool,
    }

    /// The wire toward a side: (imm, payload sequence number or None for control).
    type Wire = VecDeque<(u32, Option<u32>)>;

    struct Pair {
        sides: [Side; 2],
        wires: [Wire; 2], // wires[i]: messages toward side i
        /// Receives side i has posted now.
        posted: [u32; 2],
    }

    impl Pair {
        fn new(a: Handshake, b: Handshake, sends: [u32; 2]) -> Self {
            let side = |mine, peer, n| Side {
                credits: Credits::new(mine, peer),
                to_send: n,
                next_seq: 0,
                held: VecDeque::new(),
                delivered: Vec::new(),
                fin_wanted: false,
                fin_seen: false,
            };
            Pair {
                sides: [side(a, b, sends[0]), side(b, a, sends[1])],
                wires: [VecDeque::new(), VecDeque::new()],
                posted: [
                    a.initial + u32::from(a.ctrl_slots),
                    b.initial + u32::from(b.ctrl_slots),
                ],
            }
        }

        /// The safety property: in flight toward `i` never exceeds what `i` has posted; and
        /// what it holds and granted stays within its `data_slots`.
        fn check(&self) {
            for i in 0..2 {
                let s = &self.sides[i];
                assert!(
                    self.wires[i].len() as u32 <= self.posted[i],
                    "receiver not ready at side {i}"
                );
                assert!(
                    s.credits.data_granted() + s.credits.data_held() <= s.credits.mine.data_slots
                );
                assert_eq!(
                    self.posted[i],
                    s.credits.data_granted() + u32::from(s.credits.mine.ctrl_slots),
                    "side {i} posts exactly its grants and control receives"
                );
            }
        }

        /// Side `i` posts the receives its credits ask for.
        fn post(&mut self, i: usize) {
            let n = self.sides[i].credits.receives_wanted();
            self.posted[i] += n;
            self.sides[i].credits.granted(n);
        }

        /// Side `i` sends what it may: data, then credit updates, then FIN.
        fn pump(&mut self, i: usize) {
            let peer = 1 - i;
            let s = &mut self.sides[i];
            while s.to_send > 0 {
                let Some(imm) = s.credits.send_data() else {
                    break;
                };
                self.wires[peer].push_back((imm, Some(s.next_seq)));
                s.next_seq += 1;
                s.to_send -= 1;
            }
            while let Some(imm) = s.credits.credit_update() {
                self.wires[peer].push_back((imm, None));
            }
            if s.fin_wanted && s.to_send == 0 {
                if let Some(imm) = s.credits.send_fin() {
                    self.wires[peer].push_back((imm, None));
                }
            }
            self.check();
        }

        /// Side `i` sends a keepalive, if its control budget allows.
        fn keepalive(&mut self, i: usize) -> bool {
            let peer = 1 - i;
            let Some(imm) = self.sides[i].credits.keepalive() else {
                return false;
            };
            self.wires[peer].push_back((imm, None));
            self.check();
            true
        }

        /// Side `i` receives one message, if any.
        fn deliver(&mut self, i: usize) -> bool {
            let Some((imm, seq)) = self.wires[i].pop_front() else {
                return false;
            };
            assert!(self.posted[i] > 0, "receiver not ready at side {i}");
            self.posted[i] -= 1;
            let s = &mut self.sides[i];
            match s.credits.on_receive(Some(imm), 1).expect("protocol error") {
                Kind::Data => s.held.push_back(seq.expect("data carries a payload")),
                Kind::Credit => self.posted[i] += 1,
                Kind::Fin => {
                    s.fin_seen = true;
                    self.posted[i] += 1;
                }
            }
            self.post(i);
            self.check();
            true
        }

        /// Side `i`'s application consumes one message, if it holds any.
        fn consume(&mut self, i: usize) -> bool {
            let s = &mut self.sides[i];
            let Some(seq) = s.held.pop_front() else {
                return false;
            };
            s.delivered.push(seq);
            s.credits.consumed();
            self.post(i);
            self.check();
            true
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Pump(usize),
        Deliver(usize),
        Consume(usize),
        Keepalive(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..2usize).prop_map(Step::Pump),
            (0..2usize).prop_map(Step::Deliver),
            (0..2usize).prop_map(Step::Consume),
            (0..2usize).prop_map(Step::Keepalive),
        ]
    }

    /// Runs everything to completion with both applications consuming: nothing may be stuck.
    fn finish(p: &mut Pair) {
        for _ in 0..1_000_000 {
            let mut progress = false;
            for i in 0..2 {
                p.pump(i);
                progress |= p.deliver(i);
                progress |= p.consume(i);
            }
            if !progress {
                p.pump(0);
                p.pump(1);
                if p.wires.iter().all(VecDeque::is_empty) {
                    break;
                }
            }
        }
        for i in 0..2 {
            assert_eq!(
                p.sides[i].to_send, 0,
                "side {i} could not send everything: deadlock"
            );
            let peer = &p.sides[1 - i];
            let expect: Vec<u32> = (0..p.sides[i].next_seq).collect();
            assert_eq!(peer.delivered, expect, "in order, nothing lost or doubled");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any interleaving: never a receive overrun, never a protocol error, and once both
        /// sides consume, everything arrives in order.
        #[test]
        fn safe_and_live(
            a_data in 1u32..8, a_ctrl in 3u16..6, b_data in 1u32..8, b_ctrl in 3u16..6,
            initial in (0u32..8, 0u32..8),
            sends in (0u32..200, 0u32..200),
            steps in proptest::collection::vec(step(), 0..600),
        ) {
            // Any initial grant within the data slots.
            let a = Handshake { initial: 1 + initial.0 % a_data, ..hs(a_data, a_ctrl) };
            let b = Handshake { initial: 1 + initial.1 % b_data, ..hs(b_data, b_ctrl) };
            let mut p = Pair::new(a, b, [sends.0, sends.1]);
            for s in steps {
                match s {
                    Step::Pump(i) => p.pump(i),
                    Step::Deliver(i) => { p.deliver(i); }
                    Step::Consume(i) => { p.consume(i); }
                    Step::Keepalive(i) => { p.keepalive(i); }
                }
            }
            finish(&mut p);
        }

        /// Close delivers everything before the end: FIN comes after every data message.
        #[test]
        fn fin_after_all_data(sends in 0u32..100, data in 1u32..6, steps in proptest::collection::vec(step(), 0..300)) {
            let mut p = Pair::new(hs(data, 3), hs(data, 3), [sends, 0]);
            p.sides[0].fin_wanted = true;
            for s in steps {
                match s {
                    Step::Pump(i) => p.pump(i),
                    Step::Deliver(i) => { p.deliver(i); }
                    Step::Consume(i) => { p.consume(i); }
                    Step::Keepalive(i) => { p.keepalive(i); }
                }
                if p.sides[1].fin_seen {
                    // Everything sent before FIN has arrived (held or consumed).
                    let got = p.sides[1].delivered.len() + p.sides[1].held.len();
                    prop_assert_eq!(got as u32, sends);
                }
            }
            finish(&mut p);
            prop_assert!(p.sides[1].fin_seen);
        }
    }

    /// Far past the 2^15 wrap of the counters, with the smallest rings.
    #[test]
    fn wrap_around() {
        let mut p = Pair::new(hs(1, 3), hs(2, 3), [100_000, 70_000]);
        finish(&mut p);
    }

    /// Both applications stop reading: both senders stop, nothing overruns, no control-message
    /// storm (the loop reaches a fixed point).
    #[test]
    fn both_stalled_is_quiet() {
        let mut p = Pair::new(hs(4, 3), hs(4, 3), [50, 50]);
        for _ in 0..1000 {
            for i in 0..2 {
                p.pump(i);
                p.deliver(i);
            }
        }
        assert!(
            p.wires.iter().all(VecDeque::is_empty),
            "a storm of control messages"
        );
        assert_eq!(p.sides[0].held.len(), 4);
        finish(&mut p);
    }

    /// Two idle sides, each sending a keepalive whenever its budget allows and answering
    /// what comes: a keepalive can always go again once the peer has read and confirmed, so
    /// the budget never runs dry, and the peer reads it as a credit update that returns nothing.
    #[test]
    fn keepalives_forever() {
        for ctrl in 3..6 {
            let mut p = Pair::new(hs(2, ctrl), hs(3, 3), [0, 0]);
            let mut sent = [0u32; 2];
            for _ in 0..10_000 {
                for (i, n) in sent.iter_mut().enumerate() {
                    *n += u32::from(p.keepalive(i));
                    while p.deliver(1 - i) {}
                    p.pump(1 - i);
                    while p.deliver(i) {}
                    p.pump(i);
                }
            }
            assert!(sent.iter().all(|&n| n >= 10_000), "ctrl {ctrl}: {sent:?}");
            finish(&mut p);
        }
        let mut c = Credits::new(hs(1, 3), hs(1, 3));
        let imm = c.keepalive().expect("a free control credit");
        assert_eq!(imm >> 30, 1, "a credit update");
        let mut peer = Credits::new(hs(1, 3), hs(1, 3));
        assert_eq!(peer.on_receive(Some(imm), 0), Ok(Kind::Credit));
        assert!(
            c.keepalive().is_some(),
            "3 control credits: 2 for keepalives"
        );
        assert_eq!(
            c.keepalive(),
            None,
            "the last credit is the confirmation reserve"
        );
    }

    /// An idle connection keeps its initial grant; a stream widens the window up to
    /// `data_slots`, whatever the initial grant.
    #[test]
    fn window_grows_from_the_initial_grant() {
        let mine = Handshake {
            initial: 2,
            ..hs(16, 4)
        };
        let mut p = Pair::new(mine, hs(16, 4), [0, 0]);
        p.check();
        assert_eq!(
            p.posted[0],
            2 + 4,
            "idle: the initial grant and the control receives"
        );
        assert_eq!(p.sides[0].credits.receives_wanted(), 0);
        // Side 1 streams to side 0, whose application keeps up.
        p.sides[1].to_send = 200;
        let mut widest = 0;
        for _ in 0..10_000 {
            p.pump(1);
            while p.deliver(0) {}
            while p.consume(0) {}
            p.pump(0);
            while p.deliver(1) {}
            widest = widest.max(p.sides[0].credits.data_granted());
            if p.sides[1].to_send == 0 {
                break;
            }
        }
        assert_eq!(widest, 16, "the window grew to data_slots");
        finish(&mut p);
        // Quiet: then one message at a time, as a request/reply would; the grants the peer
        // uses are granted again only up to the initial window.
        p.sides[0].credits.quiet();
        for _ in 0..20 {
            p.sides[1].to_send = 1;
            p.pump(1);
            while p.deliver(0) {}
            while p.consume(0) {}
            p.sides[0].to_send = 1; // the reply, which carries the grants
            p.pump(0);
            while p.deliver(1) {}
            while p.consume(1) {}
        }
        assert_eq!(p.sides[1].to_send + p.sides[0].to_send, 0);
        assert_eq!(
            p.sides[0].credits.data_granted(),
            2,
            "back to the initial window"
        );
        finish(&mut p);
    }

    /// A grant below the thresholds goes out with the periodic look's `grant_update`, once.
    #[test]
    fn grant_update_tells_what_waits() {
        let mine = Handshake {
            initial: 2,
            ..hs(16, 4)
        };
        let mut c = Credits::new(mine, hs(16, 4));
        assert_eq!(
            c.grant_update(),
            None,
            "nothing granted beyond the handshake"
        );
        assert_eq!(c.on_receive(Some(0), 1), Ok(Kind::Data));
        c.granted(c.receives_wanted());
        assert_eq!(c.credit_update(), None, "one grant, the peer not blocked");
        let imm = c.grant_update().expect("the grant not yet told");
        assert_eq!((imm >> 15) & 0x7fff, 1, "it grants 1");
        assert_eq!(c.grant_update(), None, "told");
    }

    #[test]
    fn hostile_peer() {
        let mut c = Credits::new(hs(1, 3), hs(1, 3));
        assert_eq!(c.on_receive(None, 0), Err(ProtocolError::NoImmediate));
        assert_eq!(c.on_receive(Some(3 << 30), 0), Err(ProtocolError::BadKind));
        assert_eq!(c.on_receive(Some(0), 1), Ok(Kind::Data));
        assert!(matches!(
            c.on_receive(Some(0), 1),
            Err(ProtocolError::NoCredit { .. })
        ));
        let mut c = Credits::new(hs(1, 3), hs(1, 3));
        assert!(matches!(
            c.on_receive(Some(1 << 15), 1),
            Err(ProtocolError::OverReturn { .. })
        ));
        let mut c = Credits::new(hs(1, 3), hs(1, 3));
        assert!(matches!(
            c.on_receive(Some(0), 65),
            Err(ProtocolError::TooLarge { .. })
        ));
        assert_eq!(c.on_receive(Some(2 << 30), 0), Ok(Kind::Fin));
        assert_eq!(c.on_receive(Some(0), 1), Err(ProtocolError::AfterFin));
    }

    /// The peer's credit updates and confirmations after its `FIN` (it still reads what this
    /// side sends) are accepted, and the `FIN` stays received.
    #[test]
    fn fin_stays_received_after_credit_updates() {
        let mut c = Credits::new(hs(2, 4), hs(2, 4));
        assert_eq!(c.on_receive(Some(2 << 30), 0), Ok(Kind::Fin));
        assert!(c.fin_received());
        assert_eq!(c.on_receive(Some(1 << 30), 0), Ok(Kind::Credit));
        assert!(c.fin_received(), "a credit update after the FIN");
        assert_eq!(c.on_receive(Some(2 << 30), 0), Err(ProtocolError::AfterFin));
    }
}
