//! [`Group::gc_history`](super::Group::gc_history) in the file: runs `[first collection, live,
//! length]` of consecutive collections with the same count (a stack whose
//! objects all died reads `[c, 0, 60]` instead of sixty points). Points
//! `[collection, live]` (version 2) are read too.
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// More points than any history holds: a longer run is corrupt.
const MAX_POINTS: u64 = 1 << 16;

pub(super) fn serialize<S: Serializer>(points: &[[u64; 2]], s: S) -> Result<S::Ok, S::Error> {
    let mut runs: Vec<[u64; 3]> = Vec::new();
    for &[collection, live] in points {
        match runs.last_mut() {
            Some(run) if run[1] == live && run[0].checked_add(run[2]) == Some(collection) => {
                run[2] += 1
            }
            _ => runs.push([collection, live, 1]),
        }
    }
    runs.serialize(s)
}

pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<[u64; 2]>, D::Error> {
    let entries: Vec<Vec<u64>> = Vec::deserialize(d)?;
    let mut points = Vec::new();
    for entry in entries {
        match entry[..] {
            [collection, live] => points.push([collection, live]),
            [first, live, length]
                if points.len() as u64 + length <= MAX_POINTS
                    && first.checked_add(length).is_some() =>
            {
                points.extend((first..first + length).map(|c| [c, live]))
            }
            _ => return Err(D::Error::custom("a bad collection history")),
        }
    }
    Ok(points)
}
