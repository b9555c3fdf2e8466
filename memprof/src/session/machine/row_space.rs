//! Room in the kernel's row table (`UNWIND_ROWS`), shared by the files of
//! every process `attach --all` follows: where a file's rows go (the first
//! free range they fit in), how much the files of one user may hold, and
//! room given back when a file's rows are let go. Without a share, 17
//! programs of one user with big unwind tables filled the table, and every
//! program started after them had its stacks cut at the allocator's caller.

use std::collections::{BTreeMap, HashMap};

/// The files of root (the system's: libraries, installed programs) are
/// not held to a share.
const ROOT: u32 = 0;

/// Why a file's rows were given no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its owner's files hold `held` rows of the `share` one user may hold.
    OwnerShare { owner: u32, held: u32, share: u32 },
    /// No free range is long enough.
    Full,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::OwnerShare { owner, held, share } => write!(
                f,
                "the files of user {owner} hold {held} unwind rows, and one user may hold {share} (half the kernel's table)"
            ),
            Refusal::Full => write!(f, "the kernel's unwind table is full"),
        }
    }
}

/// The free and used ranges of the table.
#[derive(Debug)]
pub struct RowSpace {
    /// Free ranges, `start -> length`, neighbours merged.
    free: BTreeMap<u32, u32>,
    /// Rows held by each owner's files (root's too, not held to a share).
    by_owner: HashMap<u32, u32>,
    /// The rows one user other than root may hold.
    share: u32,
}

impl RowSpace {
    /// A table of `capacity` rows, all free.
    pub fn new(capacity: u32) -> RowSpace {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        RowSpace {
            free,
            by_owner: HashMap::new(),
            share: capacity / 2,
        }
    }

    /// Room for `count` rows of a file of `owner`: where they start.
    pub fn take(&mut self, count: u32, owner: u32) -> Result<u32, Refusal> {
        let held = self.held(owner);
        if owner != ROOT && held.saturating_add(count) > self.share {
            return Err(Refusal::OwnerShare {
                owner,
                held,
                share: self.share,
            });
        }
        let (&start, &length) = self
            .free
            .iter()
            .find(|(_, &length)| length >= count)
            .ok_or(Refusal::Full)?;
        self.free.remove(&start);
        if length > count {
            self.free.insert(start + count, length - count);
        }
        *self.by_owner.entry(owner).or_default() += count;
        Ok(start)
    }

    /// The `count` rows from `start`, of a file of `owner`, free again.
    pub fn give_back(&mut self, start: u32, count: u32, owner: u32) {
        if let Some(held) = self.by_owner.get_mut(&owner) {
            *held = held.saturating_sub(count);
            if *held == 0 {
                self.by_owner.remove(&owner);
            }
        }
        let (mut start, mut count) = (start, count);
        // Merged with the free range just before and just after.
        if let Some((&before, &length)) = self.free.range(..start).next_back() {
            if before + length == start {
                self.free.remove(&before);
                start = before;
                count += length;
            }
        }
        if let Some(length) = self.free.remove(&(start + count)) {
            count += length;
        }
        self.free.insert(start, count);
    }

    /// Rows the files of `owner` hold.
    pub fn held(&self, owner: u32) -> u32 {
        self.by_owner.get(&owner).copied().unwrap_or(0)
    }

    /// Free rows in all.
    #[cfg(test)]
    fn free_rows(&self) -> u32 {
        self.free.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_holds_half_root_the_rest() {
        let mut space = RowSpace::new(1000);
        assert_eq!(space.take(400, 65534), Ok(0));
        assert_eq!(
            space.take(101, 65534),
            Err(Refusal::OwnerShare {
                owner: 65534,
                held: 400,
                share: 500
            })
        );
        // Another user has a share of their own; root none.
        assert_eq!(space.take(300, 1000), Ok(400));
        assert_eq!(space.take(300, ROOT), Ok(700));
        assert_eq!(space.take(1, ROOT), Err(Refusal::Full));
        assert_eq!(space.free_rows(), 0);
    }

    #[test]
    fn rows_given_back_are_merged_and_taken_again() {
        let mut space = RowSpace::new(100);
        let a = space.take(30, ROOT).unwrap();
        let b = space.take(30, ROOT).unwrap();
        let c = space.take(30, ROOT).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        space.give_back(a, 30, ROOT);
        space.give_back(c, 30, ROOT);
        // 0..30 and 60..100 free: 40 fit only after b.
        assert_eq!(space.take(40, ROOT), Ok(60));
        space.give_back(60, 40, ROOT);
        space.give_back(b, 30, ROOT);
        // All merged into one range again.
        assert_eq!(space.free.len(), 1);
        assert_eq!(space.take(100, ROOT), Ok(0));
    }

    #[test]
    fn a_users_rows_given_back_make_room_in_their_share() {
        let mut space = RowSpace::new(1000);
        let first = space.take(500, 7).unwrap();
        assert!(space.take(1, 7).is_err());
        space.give_back(first, 500, 7);
        assert_eq!(space.held(7), 0);
        assert_eq!(space.take(500, 7), Ok(0));
    }
}
