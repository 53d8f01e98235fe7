//! The note's size budget: fold the largest sections to one line, then drop the largest.

use serde::Serialize;

/// How much of one section the note shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitState {
    Full,
    Folded,
    Dropped,
}

/// One section that can shrink: its estimated size in full and folded to its summary line.
#[derive(Debug, Clone)]
pub struct Unit {
    pub id: (usize, u8, usize),
    pub full: usize,
    pub folded: usize,
    pub state: UnitState,
}

/// Decide which units stay full, which fold and which are dropped so that `fixed` plus the
/// units fits `budget`. Units already folded or dropped stay so. Returns only changed units.
pub fn plan(units: &[Unit], fixed: usize, budget: usize) -> Vec<((usize, u8, usize), UnitState)> {
    let size = |u: &Unit, s: UnitState| match s {
        UnitState::Full => u.full,
        UnitState::Folded => u.folded,
        UnitState::Dropped => 0,
    };
    let mut states: Vec<UnitState> = units.iter().map(|u| u.state).collect();
    let mut total: usize = fixed + units.iter().map(|u| size(u, u.state)).sum::<usize>();
    if total > budget {
        let mut order: Vec<usize> = (0..units.len())
            .filter(|&i| states[i] == UnitState::Full)
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(units[i].full));
        for i in order {
            if total <= budget {
                break;
            }
            total = total - units[i].full + units[i].folded.min(units[i].full);
            states[i] = UnitState::Folded;
        }
    }
    if total > budget {
        let mut order: Vec<usize> = (0..units.len())
            .filter(|&i| states[i] == UnitState::Folded)
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(units[i].folded));
        for i in order {
            if total <= budget {
                break;
            }
            total -= units[i].folded.min(units[i].full);
            states[i] = UnitState::Dropped;
        }
    }
    units
        .iter()
        .zip(states)
        .filter(|(u, s)| u.state != *s)
        .map(|(u, s)| (u.id, s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(i: usize, full: usize) -> Unit {
        Unit {
            id: (0, 0, i),
            full,
            folded: 10,
            state: UnitState::Full,
        }
    }

    #[test]
    fn folds_largest_first_then_drops_largest_first() {
        let units = vec![unit(0, 100), unit(1, 500), unit(2, 300)];
        assert!(plan(&units, 0, 1000).is_empty());
        assert_eq!(plan(&units, 0, 500), vec![((0, 0, 1), UnitState::Folded)]);
        let all_folded = plan(&units, 0, 30);
        assert!(all_folded.iter().all(|(_, s)| *s == UnitState::Folded));
        let dropped = plan(&units, 0, 15);
        assert_eq!(
            dropped
                .iter()
                .filter(|(_, s)| *s == UnitState::Dropped)
                .count(),
            2
        );
    }
}
