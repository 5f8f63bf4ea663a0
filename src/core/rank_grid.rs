//! The rank grid of a Megatron-style job: world = TP x CP x DP x PP, and the
//! process groups each rank belongs to.
//!
//! Ranks are laid out in Megatron-Core's order `tp-cp-ep-dp-pp` (first axis
//! fastest): `rank = tp + cp*TP + dp*TP*CP + pp*TP*CP*DP`, or the alternative
//! `tp-cp-ep-pp-dp` (pipeline before data parallelism). Expert parallelism
//! (EP) is not modelled yet: it is 1 here.

use alloc::format;
use alloc::vec::Vec;

use super::error::{Error, Result};

/// An axis of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Tensor parallelism.
    Tp,
    /// Context parallelism.
    Cp,
    /// Data parallelism.
    Dp,
    /// Pipeline parallelism.
    Pp,
}

/// Which layout order the ranks follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RankOrder {
    /// `tp-cp-ep-dp-pp`, Megatron-Core's default.
    #[default]
    TpCpEpDpPp,
    /// `tp-cp-ep-pp-dp`.
    TpCpEpPpDp,
}

/// A rank's position on every axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Coords {
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
}

/// The validated grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankGrid {
    pub world: usize,
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
    pub order: RankOrder,
}

const OP: &str = "RankGrid::new";

impl RankGrid {
    /// A grid of `world` ranks; DP is what remains: `world / (tp*cp*pp)`.
    pub fn new(world: usize, tp: usize, cp: usize, pp: usize, order: RankOrder) -> Result<Self> {
        for (arg, v) in [("world", world), ("tp", tp), ("cp", cp), ("pp", pp)] {
            if v == 0 {
                return Err(Error::invalid(OP, arg, ">= 1", 0));
            }
        }
        let model = tp
            .checked_mul(cp)
            .and_then(|v| v.checked_mul(pp))
            .ok_or_else(|| {
                Error::invalid(
                    OP,
                    "tp*cp*pp",
                    "a product that fits in usize",
                    "an overflow",
                )
            })?;
        if world % model != 0 {
            return Err(Error::invalid(
                OP,
                "world",
                format!("a multiple of tp*cp*pp = {tp}*{cp}*{pp} = {model}"),
                world,
            ));
        }
        Ok(RankGrid {
            world,
            tp,
            cp,
            dp: world / model,
            pp,
            order,
        })
    }

    /// Sizes of the axes from fastest to slowest in this grid's order.
    fn axes(&self) -> [(Axis, usize); 4] {
        match self.order {
            RankOrder::TpCpEpDpPp => [
                (Axis::Tp, self.tp),
                (Axis::Cp, self.cp),
                (Axis::Dp, self.dp),
                (Axis::Pp, self.pp),
            ],
            RankOrder::TpCpEpPpDp => [
                (Axis::Tp, self.tp),
                (Axis::Cp, self.cp),
                (Axis::Pp, self.pp),
                (Axis::Dp, self.dp),
            ],
        }
    }

    pub fn size(&self, axis: Axis) -> usize {
        match axis {
            Axis::Tp => self.tp,
            Axis::Cp => self.cp,
            Axis::Dp => self.dp,
            Axis::Pp => self.pp,
        }
    }

    /// The coordinates of `rank`.
    pub fn coords(&self, rank: usize) -> Result<Coords> {
        if rank >= self.world {
            return Err(Error::invalid(
                "RankGrid::coords",
                "rank",
                format!("< world = {}", self.world),
                rank,
            ));
        }
        let mut c = Coords {
            tp: 0,
            cp: 0,
            dp: 0,
            pp: 0,
        };
        let mut rest = rank;
        for (axis, size) in self.axes() {
            let v = rest % size;
            rest /= size;
            match axis {
                Axis::Tp => c.tp = v,
                Axis::Cp => c.cp = v,
                Axis::Dp => c.dp = v,
                Axis::Pp => c.pp = v,
            }
        }
        Ok(c)
    }

    /// The rank at `coords`.
    pub fn rank(&self, c: Coords) -> Result<usize> {
        let mut rank = 0;
        let mut stride = 1;
        for (axis, size) in self.axes() {
            let v = match axis {
                Axis::Tp => c.tp,
                Axis::Cp => c.cp,
                Axis::Dp => c.dp,
                Axis::Pp => c.pp,
            };
            if v >= size {
                return Err(Error::invalid(
                    "RankGrid::rank",
                    "coords",
                    format!("{axis:?} < {size}"),
                    v,
                ));
            }
            rank += v * stride;
            stride *= size;
        }
        Ok(rank)
    }

    /// The members (ascending) of `rank`'s group along `axes`: the ranks that
    /// differ from it only in those coordinates. `&[Axis::Tp]` is its TP
    /// group; `&[Axis::Tp, Axis::Pp]` its model-parallel group;
    /// `&[Axis::Dp, Axis::Cp]` the data-parallel group with context parallelism.
    pub fn group(&self, rank: usize, axes: &[Axis]) -> Result<Vec<usize>> {
        let base = self.coords(rank)?;
        let mut members = Vec::new();
        for r in 0..self.world {
            let c = self.coords(r)?;
            let same = |a: Axis, x: usize, y: usize| axes.contains(&a) || x == y;
            if same(Axis::Tp, c.tp, base.tp)
                && same(Axis::Cp, c.cp, base.cp)
                && same(Axis::Dp, c.dp, base.dp)
                && same(Axis::Pp, c.pp, base.pp)
            {
                members.push(r);
            }
        }
        Ok(members)
    }

    /// Every group along `axes`, each ascending, ordered by their first rank.
    pub fn all_groups(&self, axes: &[Axis]) -> Result<Vec<Vec<usize>>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for r in 0..self.world {
            let g = self.group(r, axes)?;
            if g[0] == r {
                groups.push(g);
            }
        }
        Ok(groups)
    }

    /// Index of the group along `axes` that `rank` belongs to, and its rank
    /// within that group: the (color, key) pair to split a communicator with.
    pub fn color_and_key(&self, rank: usize, axes: &[Axis]) -> Result<(usize, usize)> {
        let g = self.group(rank, axes)?;
        let color = self
            .all_groups(axes)?
            .iter()
            .position(|h| h[0] == g[0])
            .unwrap_or(0);
        let key = g.iter().position(|&r| r == rank).unwrap_or(0);
        Ok((color, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// Megatron's documented example: 16 ranks, tp=2, pp=4 (so dp=2).
    #[test]
    fn megatron_sixteen_rank_example() {
        let g = RankGrid::new(16, 2, 1, 4, RankOrder::TpCpEpDpPp).unwrap();
        assert_eq!(g.dp, 2);
        let tp = g.all_groups(&[Axis::Tp]).unwrap();
        assert_eq!(
            tp,
            vec![
                vec![0, 1],
                vec![2, 3],
                vec![4, 5],
                vec![6, 7],
                vec![8, 9],
                vec![10, 11],
                vec![12, 13],
                vec![14, 15]
            ]
        );
        let dp = g.all_groups(&[Axis::Dp]).unwrap();
        assert_eq!(
            dp,
            vec![
                vec![0, 2],
                vec![1, 3],
                vec![4, 6],
                vec![5, 7],
                vec![8, 10],
                vec![9, 11],
                vec![12, 14],
                vec![13, 15]
            ]
        );
        let pp = g.all_groups(&[Axis::Pp]).unwrap();
        assert_eq!(
            pp,
            vec![
                vec![0, 4, 8, 12],
                vec![1, 5, 9, 13],
                vec![2, 6, 10, 14],
                vec![3, 7, 11, 15]
            ]
        );
        // rank = tp + dp*TP + pp*TP*DP
        assert_eq!(
            g.coords(13).unwrap(),
            Coords {
                tp: 1,
                cp: 0,
                dp: 0,
                pp: 3
            }
        );
        assert_eq!(
            g.rank(Coords {
                tp: 1,
                cp: 0,
                dp: 1,
                pp: 2
            })
            .unwrap(),
            1 + 2 + 2 * 4
        );
        assert_eq!(g.color_and_key(9, &[Axis::Pp]).unwrap(), (1, 2));
    }

    #[test]
    fn pp_before_dp_order_and_context_parallelism() {
        let g = RankGrid::new(16, 2, 2, 2, RankOrder::TpCpEpPpDp).unwrap();
        assert_eq!(g.dp, 2);
        // rank = tp + cp*2 + pp*4 + dp*8
        assert_eq!(
            g.coords(13).unwrap(),
            Coords {
                tp: 1,
                cp: 0,
                dp: 1,
                pp: 1
            }
        );
        assert_eq!(g.group(0, &[Axis::Cp]).unwrap(), vec![0, 2]);
        assert_eq!(g.group(0, &[Axis::Pp]).unwrap(), vec![0, 4]);
        assert_eq!(g.group(0, &[Axis::Dp]).unwrap(), vec![0, 8]);
        for r in 0..16 {
            assert_eq!(g.rank(g.coords(r).unwrap()).unwrap(), r);
        }
        // Every axis partitions the world.
        for axis in [Axis::Tp, Axis::Cp, Axis::Dp, Axis::Pp] {
            let groups = g.all_groups(&[axis]).unwrap();
            assert_eq!(groups.len() * g.size(axis), 16);
        }
    }

    #[test]
    fn invalid_grids_are_clear_errors() {
        let e = RankGrid::new(12, 5, 1, 1, RankOrder::default()).unwrap_err();
        assert!(
            alloc::format!("{e}").contains("multiple of tp*cp*pp"),
            "{e}"
        );
        assert!(RankGrid::new(0, 1, 1, 1, RankOrder::default()).is_err());
        assert!(RankGrid::new(8, 0, 1, 1, RankOrder::default()).is_err());
        assert!(RankGrid::new(8, usize::MAX, 2, 1, RankOrder::default()).is_err());
        let g = RankGrid::new(8, 2, 1, 1, RankOrder::default()).unwrap();
        assert!(g.coords(8).is_err());
        assert!(g
            .rank(Coords {
                tp: 2,
                cp: 0,
                dp: 0,
                pp: 0
            })
            .is_err());
    }
}
