//! Making room in a full map in one pass, so a flood of new keys costs amortised O(1) per key,
//! not a scan of the whole map per key.

use std::collections::HashMap;
use std::hash::Hash;

/// The share of a full map freed at once: one pass every eighth of the bound.
pub(crate) const EVICT_SHARE: usize = 8;

/// Removes from `map` every entry whose `rank` is at most `floor` (dead already; `None`: no
/// entry is) and at least
/// the `count` entries of lowest rank (ties broken arbitrarily, never more than needed),
/// calling `gone` on each: one selection and one sweep, `O(n)`.
pub(crate) fn evict_lowest<K: Eq + Hash, V>(
    map: &mut HashMap<K, V>,
    count: usize,
    floor: Option<u64>,
    rank: impl Fn(&V) -> u64,
    mut gone: impl FnMut(&K, &V),
) {
    let count = count.clamp(1, map.len().max(1));
    let mut ranks: Vec<u64> = map.values().map(&rank).collect();
    if ranks.is_empty() {
        return;
    }
    let (below, &mut cut, _) = ranks.select_nth_unstable(count - 1);
    // The entries ranked `cut` to take beside those below it.
    let mut ties = count - below.iter().filter(|r| **r < cut).count();
    map.retain(|k, v| {
        let r = rank(v);
        let go = r < cut || floor.is_some_and(|f| r <= f) || (r == cut && ties > 0);
        if r == cut && go && ties > 0 {
            ties -= 1;
        }
        if go {
            gone(k, v);
        }
        !go
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_lowest_and_the_dead_and_no_more_among_ties() {
        let mut map: HashMap<u32, u64> = (0..10).map(|k| (k, 5)).collect();
        map.insert(10, 1);
        map.insert(11, 9);
        let mut gone = Vec::new();
        evict_lowest(&mut map, 3, None, |v| *v, |k, _| gone.push(*k));
        gone.sort_unstable();
        assert_eq!(gone.len(), 3, "1 below the cut and 2 of the 10 ties: {gone:?}");
        assert!(gone.contains(&10) && !gone.contains(&11));
        assert_eq!(map.len(), 9);
        // Everything at or under the floor goes, however many.
        evict_lowest(&mut map, 1, Some(5), |v| *v, |_, _| {});
        assert_eq!(map.into_keys().collect::<Vec<_>>(), vec![11]);
    }
}
