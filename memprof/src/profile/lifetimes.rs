//! How long the objects of one stack lived ([`Lifetimes`]), and how a
//! group's lifetimes are written in the file.
use serde::{Deserialize, Serialize};

pub use memprof_common::LIFETIME_BOUNDS_NS;

/// [`Group::lifetimes`](super::Group::lifetimes) in the file: `[died, total_ns, [buckets],
/// within_first_collection, collections_survived]`, without the field
/// names of every group. The object (version 2) is read too.
pub(super) mod compact_lifetimes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Lifetimes;

    type Tuple = (u64, u64, [u64; 8], u64, u64);

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Tuple(Tuple),
        Object(Lifetimes),
    }

    pub(in crate::profile) fn serialize<S: Serializer>(
        l: &Lifetimes,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let tuple: Tuple = (
            l.died,
            l.total_ns,
            l.buckets,
            l.within_first_collection,
            l.collections_survived,
        );
        tuple.serialize(s)
    }

    pub(in crate::profile) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Lifetimes, D::Error> {
        Ok(match Either::deserialize(d)? {
            Either::Object(l) => l,
            Either::Tuple((
                died,
                total_ns,
                buckets,
                within_first_collection,
                collections_survived,
            )) => Lifetimes {
                died,
                total_ns,
                buckets,
                within_first_collection,
                collections_survived,
            },
        })
    }
}

/// Lifetimes of the objects of one stack that died while profiled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetimes {
    /// Objects that died: freed (libc, `GC_free`) or collected.
    pub died: u64,
    /// Sum of their lifetimes, nanoseconds (allocation to free; for
    /// collected objects, to the end of the collection that found them dead).
    pub total_ns: u64,
    /// Histogram of lifetimes: bucket `i` counts lifetimes below
    /// `LIFETIME_BOUNDS_NS[i]` (and at least the bound before); the last
    /// bucket the rest.
    pub buckets: [u64; 8],
    /// GC kinds: collected at the first collection after their allocation
    /// (they did not survive one collection).
    pub within_first_collection: u64,
    /// GC kinds: sum over collected objects of the collections they survived.
    pub collections_survived: u64,
}

impl Lifetimes {
    /// Nothing died.
    pub fn is_empty(&self) -> bool {
        *self == Lifetimes::default()
    }

    /// Adds one death after `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        self.died += 1;
        self.total_ns += ns;
        self.buckets[memprof_common::lifetime_bucket(ns)] += 1;
    }

    /// Every count times `f` (sampled lifetimes to estimates).
    pub(crate) fn scale(&mut self, f: f64) {
        let times = |n: &mut u64| *n = (*n as f64 * f).round() as u64;
        for n in [
            &mut self.died,
            &mut self.total_ns,
            &mut self.within_first_collection,
            &mut self.collections_survived,
        ] {
            times(n);
        }
        self.buckets.iter_mut().for_each(times);
    }

    /// Adds `other`'s deaths.
    pub(crate) fn add(&mut self, other: &Lifetimes) {
        self.died += other.died;
        self.total_ns += other.total_ns;
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
        self.within_first_collection += other.within_first_collection;
        self.collections_survived += other.collections_survived;
    }

    /// Deaths younger than `ns`, counted from whole buckets (so `ns` is
    /// rounded up to the next bucket bound).
    pub fn died_within(&self, ns: u64) -> u64 {
        let upto = LIFETIME_BOUNDS_NS
            .iter()
            .position(|&bound| ns <= bound)
            .unwrap_or(LIFETIME_BOUNDS_NS.len());
        self.buckets[..=upto].iter().sum()
    }
}
