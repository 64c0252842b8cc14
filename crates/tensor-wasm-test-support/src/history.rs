//! A history of concurrent requests against replicas, and its check against a sequential model.
//!
//! Every request a client sends is recorded with the times it was sent and answered (seconds
//! from the run's start) as one [`Event`]: writes of a key's value and reads of it. The model
//! is a register per key, changed by writes in an order consistent with real time: a write
//! answered before another was sent comes first. A replica may show a write late, but at most
//! `bound` seconds after it was answered (the documented propagation bound).
//!
//! For each read, the values it may see are:
//! - those of the *latest settled* writes: answered at least `bound` before the read was sent,
//!   and not followed in real time by another such write (several when they overlapped);
//!   the key's initial value when there is none;
//! - those of writes not settled yet when the read was sent but sent before it was answered
//!   (in flight, or inside the bound);
//! - those of writes whose outcome is unknown (a 5xx, a lost connection), sent before the read
//!   was answered: they may have taken effect, at any time after they were sent.
//!
//! A read that sees anything else is an [`Anomaly`]: a revoked token accepted again, a deleted
//! function back, a quota change lost. A *conditional* write (a change that needs the record
//! to exist) reads too: when every value it may see fails its condition and it was acknowledged
//! all the same, that is an anomaly (a change that re-created a deleted function).
//!
//! Windows of known trouble (a replica killed, the database restarted) push the bound of writes
//! answered shortly before or during them to the window's end plus `bound`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// How a write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged (2xx): it took effect.
    Done,
    /// Refused (4xx): it did not take effect.
    Refused,
    /// Unknown (5xx, transport error): it may have taken effect.
    Unknown,
}

/// What a request did to a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Set the key to `value`; `needs` is the condition on the value it replaces (`None`: any).
    Write {
        value: String,
        outcome: Outcome,
        needs: Option<Condition>,
    },
    /// Saw `value`.
    Read { value: String },
}

/// A condition on the value a conditional write replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Not this value (e.g. not `absent`).
    Not(String),
}

impl Condition {
    fn holds(&self, value: &str) -> bool {
        match self {
            Condition::Not(v) => v != value,
        }
    }
}

/// One request's effect on one key.
#[derive(Debug, Clone)]
pub struct Event {
    pub key: String,
    /// The record the key lives in: writes to one record at once are the conflicting writes
    /// counted by [`check`].
    pub record: String,
    /// When the request was sent and answered, in seconds from the run's start.
    pub start: f64,
    pub end: f64,
    /// Which client sent it, and to which replica.
    pub client: usize,
    pub replica: usize,
    pub kind: Kind,
}

/// A read (or a conditional write's read) that the model does not allow.
#[derive(Debug, Clone)]
pub struct Anomaly {
    pub key: String,
    pub what: String,
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    pub events: usize,
    pub reads: usize,
    pub writes: usize,
    pub unknown_writes: usize,
    /// Pairs of acknowledged writes to one record that overlapped in time.
    pub conflicting_writes: usize,
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    /// A few lines for a failed assertion.
    #[must_use]
    pub fn describe(&self, max: usize) -> String {
        let mut text = format!(
            "{} events, {} reads, {} writes ({} unknown), {} conflicting write pairs, {} anomalies",
            self.events,
            self.reads,
            self.writes,
            self.unknown_writes,
            self.conflicting_writes,
            self.anomalies.len()
        );
        for a in self.anomalies.iter().take(max) {
            let _ = write!(text, "\n  {}: {}", a.key, a.what);
        }
        text
    }
}

/// Checks `events` against the model (see the module documentation); keys start at
/// `initial(key)`. `trouble` lists windows `(from, to)` of known trouble.
#[must_use]
pub fn check(
    events: &[Event],
    bound: f64,
    trouble: &[(f64, f64)],
    initial: impl Fn(&str) -> String,
) -> Report {
    let mut report = Report {
        events: events.len(),
        ..Report::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_key.entry(&e.key).or_default().push(e);
        match &e.kind {
            Kind::Read { .. } => report.reads += 1,
            Kind::Write { outcome, .. } => {
                report.writes += 1;
                if *outcome == Outcome::Unknown {
                    report.unknown_writes += 1;
                }
            }
        }
    }
    // When a write is surely visible everywhere.
    let settled = |w: &Event| {
        let mut at = w.end + bound;
        for &(from, to) in trouble {
            if w.end + bound > from && w.start < to {
                at = at.max(to + bound);
            }
        }
        at
    };
    for (key, list) in &by_key {
        let writes: Vec<&Event> = list
            .iter()
            .copied()
            .filter(
                |e| matches!(e.kind, Kind::Write { outcome, .. } if outcome != Outcome::Refused),
            )
            .collect();
        let allowed = |reader: &Event| -> Vec<&str> {
            let done: Vec<&Event> = writes
                .iter()
                .copied()
                .filter(|w| {
                    !std::ptr::eq(*w, reader)
                        && matches!(
                            w.kind,
                            Kind::Write {
                                outcome: Outcome::Done,
                                ..
                            }
                        )
                        && settled(w) <= reader.start
                })
                .collect();
            // Not followed by another settled write: answered after the last one was sent.
            let last_sent = done.iter().map(|w| w.start).fold(f64::MIN, f64::max);
            let mut values: Vec<&str> = done
                .iter()
                .filter(|w| w.end >= last_sent)
                .map(|w| value_of(w))
                .collect();
            if done.is_empty() {
                values.push("");
            }
            for w in &writes {
                if std::ptr::eq(*w, reader) || w.start >= reader.end {
                    continue;
                }
                let unknown = matches!(
                    w.kind,
                    Kind::Write {
                        outcome: Outcome::Unknown,
                        ..
                    }
                );
                if unknown || settled(w) > reader.start {
                    values.push(value_of(w));
                }
            }
            values
        };
        let initial = initial(key);
        for e in list {
            let seen = |v: &'_ str| -> String {
                if v.is_empty() {
                    initial.clone()
                } else {
                    v.to_owned()
                }
            };
            match &e.kind {
                Kind::Read { value } => {
                    let may: Vec<String> = allowed(e).into_iter().map(seen).collect();
                    if !may.contains(value) {
                        report.anomalies.push(Anomaly {
                            key: (*key).to_owned(),
                            what: format!(
                                "client {} read {value:?} on replica {} at {:.3}..{:.3}s; \
                                 the model allows {may:?}",
                                e.client, e.replica, e.start, e.end
                            ),
                        });
                    }
                }
                Kind::Write {
                    value,
                    outcome: Outcome::Done,
                    needs: Some(condition),
                } => {
                    let may: Vec<String> = allowed(e).into_iter().map(seen).collect();
                    if !may.iter().any(|v| condition.holds(v)) {
                        report.anomalies.push(Anomaly {
                            key: (*key).to_owned(),
                            what: format!(
                                "client {} wrote {value:?} on replica {} at {:.3}..{:.3}s, \
                                 acknowledged, though every value it could replace ({may:?}) \
                                 fails {condition:?}",
                                e.client, e.replica, e.start, e.end
                            ),
                        });
                    }
                }
                Kind::Write { .. } => {}
            }
        }
    }
    // Conflicting writes: acknowledged writes to one record overlapping in time.
    let mut by_record: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for e in events {
        if matches!(
            e.kind,
            Kind::Write {
                outcome: Outcome::Done,
                ..
            }
        ) {
            by_record
                .entry(&e.record)
                .or_default()
                .push((e.start, e.end));
        }
    }
    for spans in by_record.values_mut() {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (i, a) in spans.iter().enumerate() {
            report.conflicting_writes += spans[i + 1..].iter().take_while(|b| b.0 < a.1).count();
        }
    }
    report
}

fn value_of(w: &Event) -> &str {
    match &w.kind {
        Kind::Write { value, .. } | Kind::Read { value } => value,
    }
}

/// A small deterministic generator (xorshift64*), so that a run is repeated from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &str, start: f64, end: f64, value: &str) -> Event {
        Event {
            key: key.into(),
            record: key.into(),
            start,
            end,
            client: 0,
            replica: 0,
            kind: Kind::Write {
                value: value.into(),
                outcome: Outcome::Done,
                needs: None,
            },
        }
    }

    fn read(key: &str, start: f64, end: f64, value: &str) -> Event {
        Event {
            kind: Kind::Read {
                value: value.into(),
            },
            ..write(key, start, end, "")
        }
    }

    fn anomalies(events: &[Event]) -> usize {
        check(events, 1.0, &[], |_| "absent".into()).anomalies.len()
    }

    #[test]
    fn a_revoked_token_accepted_after_the_bound_is_an_anomaly() {
        let created = write("token", 0.0, 0.1, "valid");
        let revoked = write("token", 1.0, 1.1, "revoked");
        // Inside the bound either is fine.
        assert_eq!(
            anomalies(&[
                created.clone(),
                revoked.clone(),
                read("token", 1.5, 1.6, "valid")
            ]),
            0
        );
        assert_eq!(
            anomalies(&[created, revoked, read("token", 2.2, 2.3, "valid")]),
            1
        );
    }

    #[test]
    fn overlapping_writes_may_land_in_either_order_but_later_ones_win() {
        let a = write("quota", 0.0, 0.5, "1");
        let b = write("quota", 0.2, 0.6, "2");
        let c = write("quota", 0.7, 0.8, "3");
        assert_eq!(
            anomalies(&[a.clone(), b.clone(), read("quota", 2.0, 2.1, "1")]),
            0
        );
        assert_eq!(
            anomalies(&[a.clone(), b.clone(), read("quota", 2.0, 2.1, "2")]),
            0
        );
        assert_eq!(anomalies(&[a, b, c, read("quota", 2.0, 2.1, "1")]), 1);
    }

    #[test]
    fn a_change_acknowledged_on_a_deleted_record_is_an_anomaly() {
        let created = write("fn", 0.0, 0.1, "present");
        let deleted = write("fn", 0.5, 0.6, "absent");
        let mut patched = write("fn", 2.0, 2.1, "present");
        patched.kind = Kind::Write {
            value: "present".into(),
            outcome: Outcome::Done,
            needs: Some(Condition::Not("absent".into())),
        };
        assert_eq!(anomalies(&[created, deleted, patched]), 1);
    }

    #[test]
    fn unknown_writes_may_have_happened_and_refused_ones_did_not() {
        let mut unknown = write("q", 0.0, 0.1, "9");
        unknown.kind = Kind::Write {
            value: "9".into(),
            outcome: Outcome::Unknown,
            needs: None,
        };
        let mut refused = write("q", 0.0, 0.1, "8");
        refused.kind = Kind::Write {
            value: "8".into(),
            outcome: Outcome::Refused,
            needs: None,
        };
        assert_eq!(anomalies(&[unknown, read("q", 5.0, 5.1, "9")]), 0);
        assert_eq!(anomalies(&[refused, read("q", 5.0, 5.1, "8")]), 1);
        assert_eq!(anomalies(&[read("q", 5.0, 5.1, "absent")]), 0);
    }

    #[test]
    fn trouble_extends_the_bound_of_writes_near_it() {
        let revoked = write("t", 1.0, 1.1, "revoked");
        let created = write("t", 0.0, 0.1, "valid");
        let late = read("t", 3.0, 3.1, "valid");
        assert_eq!(
            check(
                &[created.clone(), revoked.clone(), late.clone()],
                1.0,
                &[],
                |_| "absent".into()
            )
            .anomalies
            .len(),
            1
        );
        assert_eq!(
            check(&[created, revoked, late], 1.0, &[(1.5, 4.0)], |_| "absent"
                .into())
            .anomalies
            .len(),
            0
        );
    }

    #[test]
    fn conflicting_writes_are_overlapping_acknowledged_writes_to_one_record() {
        let report = check(
            &[
                write("r", 0.0, 1.0, "1"),
                write("r", 0.5, 1.5, "2"),
                write("r", 2.0, 3.0, "3"),
            ],
            1.0,
            &[],
            |_| String::new(),
        );
        assert_eq!(report.conflicting_writes, 1);
    }
}
