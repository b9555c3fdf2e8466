//! The core tables and what writes them: each block followed is in `LIVE`
//! (keyed by address) until freed, each site's totals in `SITE_TOTALS`,
//! each frame-pointer stack in `STACKS`; what could not be recorded is
//! counted in `COUNTERS` (`counters`).
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap, StackTrace},
};
use memprof_common::{
    errno, gc_event, host, lifetime_bucket, AllocKind, AllocSite, KindLive, LiveAlloc, PendingCall,
    SiteTotals, SITES_OVERFLOW,
};

use crate::counters::bump;
use crate::gc::{judge_later, GC_EPOCH};
use crate::gc_copy::{gc_event, gc_time, in_copy, is_gc, previous_word};
use crate::settings::GC_VERDICTS;

// Sizes are defaults; userspace sets them from --max-live / --max-stacks.
#[map]
pub(crate) static LIVE: HashMap<u64, LiveAlloc> = HashMap::with_max_entries(1 << 20, 0);
/// What `LIVE` holds per kind (one entry per CPU): timeline samples read
/// it instead of the table.
#[map]
static LIVE_BY_KIND: PerCpuArray<KindLive> = PerCpuArray::with_max_entries(1, 0);
/// Filled on demand (BPF_F_NO_PREALLOC).
#[map]
static SITE_TOTALS: PerCpuHashMap<AllocSite, SiteTotals> =
    PerCpuHashMap::with_max_entries(1 << 18, BPF_F_NO_PREALLOC);
/// Per allocation kind: the totals of sites the site table had no room for.
#[map]
static OVERFLOW_TOTALS: PerCpuArray<SiteTotals> =
    PerCpuArray::with_max_entries(AllocKind::ALL.len() as u32, 0);
#[map]
pub(crate) static STACKS: StackTrace = StackTrace::with_max_entries(1 << 15, 0);

/// Records a page written for the first time (`rss`) at `key`, its
/// `LIVE` key, under `site`; `size`: a page.
#[inline(always)]
pub(crate) fn record_page(key: u64, site: &AllocSite, size: u64) {
    bump(|c| &mut c.allocs);
    let (site, in_totals) = add_to_totals(site, size);
    let now = unsafe { bpf_ktime_get_ns() };
    let live = LiveAlloc {
        site,
        size,
        timestamp_ns: now,
        epoch: 0,
    };
    count_losses(insert_live(key, &live, now), in_totals);
}

/// A page recorded by [`record_page`] given back (unmapped or
/// discarded): out of `LIVE`, its lifetime to its site.
#[inline(always)]
pub(crate) fn release_page(key: u64, now: u64) {
    if let Some(old) = LIVE.get_ptr(&key) {
        forget(key, &unsafe { *old }, now);
    }
}

/// A live block `old` at `key` freed: its lifetime to its site, out of
/// `LIVE`.
#[inline(always)]
fn forget(key: u64, old: &LiveAlloc, now: u64) {
    retire(old, now, false);
    if LIVE.remove(&key).is_ok() {
        count_live(old.site.kind, old.size, -1);
    }
}

/// Adds a block of `size` bytes to `site`'s totals: the site it is
/// recorded under (its kind's overflow site when the table is full) and
/// whether it is in the totals.
#[inline(always)]
fn add_to_totals(site: &AllocSite, size: u64) -> (AllocSite, bool) {
    let (site, totals) = site_totals(site);
    match totals {
        Some(totals) => unsafe {
            (*totals).count += 1;
            (*totals).bytes += size;
            (site, true)
        },
        None => (site, false),
    }
}

/// Each allocation not fully recorded is counted once, in one category.
#[inline(always)]
fn count_losses(in_live: bool, in_totals: bool) {
    match (in_live, in_totals) {
        (true, true) => {}
        (false, true) => bump(|c| &mut c.live_map_full),
        (true, false) => bump(|c| &mut c.sites_map_full),
        (false, false) => bump(|c| &mut c.both_maps_full),
    }
}

/// Records an allocation at `addr`; `slot`: the thread's `PENDING` slot.
#[inline(always)]
pub(crate) fn record(
    addr: u64,
    call: &PendingCall,
    replaces: u64,
    slot: *mut PendingCall,
    objects: u16,
) {
    bump(|c| &mut c.allocs);
    let epoch = GC_EPOCH.get(0).copied().unwrap_or(0);
    let copied = in_copy(call.site.kind);
    let (site, in_totals, now) = if copied {
        // Userspace's copy sums the totals from the event: no per-site
        // lookup here.
        (call.site, true, gc_time(slot, epoch, replaces != 0))
    } else {
        // The site's totals first: when the site table is full, the
        // block is recorded under its kind's overflow site, live entry
        // included.
        let (site, in_totals) = add_to_totals(&call.site, call.size);
        (site, in_totals, unsafe { bpf_ktime_get_ns() })
    };
    let live = LiveAlloc {
        site,
        size: call.size,
        timestamp_ns: now,
        epoch,
    };
    let in_live = if copied {
        // Userspace's copy is the only one (address reuse is seen there);
        // an event the ring had no room for is counted as such.
        let typed = previous_word(slot, epoch, replaces);
        gc_event(addr, gc_event::ALLOC, &live, replaces, objects, typed);
        unsafe {
            (*slot).last_gc = addr;
            (*slot).last_gc_epoch = epoch;
        }
        if GC_VERDICTS.load() == 1 {
            judge_later(addr, epoch);
        }
        true
    } else {
        insert_live(host::live_key(addr, call.site.process), &live, now)
    };
    count_losses(in_live, in_totals);
}

/// Puts `live` in `LIVE` at `key`; whether there was room. Added if new
/// (one hash operation, the usual case). An address still live was freed
/// without us seeing it: for a GC object, collected (its address was
/// reused); else a missed free.
#[inline(always)]
fn insert_live(key: u64, live: &LiveAlloc, now: u64) -> bool {
    let inserted = match LIVE.insert(&key, live, BPF_NOEXIST as u64) {
        Ok(()) => true,
        Err(e) if e == -errno::EEXIST => {
            if let Some(old) = LIVE.get_ptr(&key) {
                let old = unsafe { *old };
                retire(&old, now, true);
                count_live(old.site.kind, old.size, -1);
            }
            LIVE.insert(&key, live, 0).is_ok()
        }
        Err(_) => false,
    };
    if inserted {
        count_live(live.site.kind, live.size, 1);
    }
    inserted
}

/// The site an allocation is recorded under and its totals (this CPU's
/// slot): its own, added to the table if new; when the table has no
/// room, its kind's overflow slot (counted in `sites_overflowed`), so
/// totals stay exact.
#[inline(always)]
fn site_totals(site: &AllocSite) -> (AllocSite, Option<*mut SiteTotals>) {
    if let Some(totals) = SITE_TOTALS.get_ptr_mut(site) {
        return (*site, Some(totals));
    }
    // Another CPU may add it meanwhile (EEXIST): the lookup after finds it.
    if SITE_TOTALS
        .insert(site, &SiteTotals::default(), BPF_NOEXIST as u64)
        .is_ok()
    {
        bump(|c| &mut c.sites_stored);
    }
    if let Some(totals) = SITE_TOTALS.get_ptr_mut(site) {
        return (*site, Some(totals));
    }
    bump(|c| &mut c.sites_overflowed);
    let overflow = AllocSite {
        caller: 0,
        stack_id: SITES_OVERFLOW,
        kind: site.kind,
        _pad: [0; 3],
        process: site.process,
    };
    (overflow, overflow_totals(site.kind))
}

/// The overflow slot of allocation kind `kind`.
#[inline(always)]
fn overflow_totals(kind: u8) -> Option<*mut SiteTotals> {
    OVERFLOW_TOTALS.get_ptr_mut(kind as u32)
}

/// Adds `sign` blocks of `size` bytes to `LIVE_BY_KIND` (this CPU's slot).
#[inline(always)]
fn count_live(kind: u8, size: u64, sign: i64) {
    let k = (kind & 7) as usize;
    if let Some(slot) = LIVE_BY_KIND.get_ptr_mut(0) {
        unsafe {
            (*slot).blocks[k] += sign;
            (*slot).bytes[k] += sign * size as i64;
        }
    }
}

/// Adds a dead block's lifetime to its site's totals (this CPU's slot).
#[inline(always)]
fn retire(old: &LiveAlloc, now: u64, reused: bool) {
    let totals = match SITE_TOTALS.get_ptr_mut(&old.site) {
        Some(totals) => totals,
        None if old.site.stack_id == SITES_OVERFLOW => match overflow_totals(old.site.kind) {
            Some(totals) => totals,
            None => return,
        },
        None => return, // not in the totals (counted when it was allocated)
    };
    let lifetime = now.saturating_sub(old.timestamp_ns);
    let gc = is_gc(old.site.kind);
    unsafe {
        (*totals).died += 1;
        (*totals).lifetime_ns += lifetime;
        (*totals).buckets[lifetime_bucket(lifetime) & 7] += 1;
        if reused && gc {
            (*totals).reused += 1;
            (*totals).reused_bytes += old.size;
        }
    }
}

/// Forgets a freed block (`key`: its `LIVE` key, [`host::live_key`]);
/// returns its kind if it was known. `kind`: the freeing function's
/// (its attach cookie, or the realloc's). `first_word`: the block's, read
/// before it was freed (`gc::first_word`), or 0.
#[inline(always)]
pub(crate) fn release(key: u64, kind: u8, first_word: u64) -> Option<u8> {
    bump(|c| &mut c.frees);
    // The clock is read only for a block that is known: with
    // sampling most frees are of blocks never followed, and a clock
    // read is a fifth of such a free's probe time.
    if in_copy(kind) {
        let now = unsafe { bpf_ktime_get_ns() };
        // The copy knows the object (or counts the free as unknown).
        let gone = LiveAlloc {
            site: AllocSite {
                caller: first_word,
                stack_id: 0,
                kind,
                _pad: [0; 3],
                process: 0,
            },
            size: 0,
            timestamp_ns: now,
            epoch: 0,
        };
        // Only without `attach --all`: the key is the address.
        gc_event(key, gc_event::GONE, &gone, 0, 1, (0, 0));
        return None;
    }
    match LIVE.get_ptr(&key) {
        Some(old) => {
            let old = unsafe { *old };
            forget(key, &old, unsafe { bpf_ktime_get_ns() });
            Some(old.site.kind)
        }
        None => {
            bump(|c| &mut c.unknown_frees);
            None
        }
    }
}
