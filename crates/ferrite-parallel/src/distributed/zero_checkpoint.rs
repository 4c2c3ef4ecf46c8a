//! What ZeRO contributes to a sharded checkpoint, and how a saved state comes back into this
//! rank's shards — at any world size.
//!
//! Each rank saves its pieces (see `ferrite_optim::FlatPartition`): which parameter, where in it, the f32
//! master values, and the sharded optimizer's state of that piece. Those pieces, from all ranks,
//! tile every trainable parameter exactly once, so a reader can join them into the full
//! parameters and the full optimizer state in the ordinary single-device layout (the optimizer
//! built over the model's parameters, indices counted over its groups) without knowing the world
//! size of the run that saved them. Resuming goes the other way: from the full state, each rank
//! cuts its own pieces for *its* world size, which is how a checkpoint saved on 3 ranks resumes
//! on 2 or on 1. The exact update rules are element-wise (see `ferrite_optim::FlatPartition`), so a state cut
//! differently continues exactly as the uncut one would.
//!
//! The collectives a save and a resume need (agreeing that every rank succeeded, rank 0's save
//! tag) carry each rank's status, so a rank that fails there stops every rank with an error
//! naming it — never a hang.

use ferrite_optim::{GroupState, Optimizer, OptimizerState, StateValue};
use ferrite_tensor::{Tensor, no_grad};

use super::error::{DistributedError, Result};
use super::zero::{OptimizerLayout, ZeroRedundancy, piece_values};

/// One piece of this rank's shard, as a checkpoint stores it.
#[derive(Debug, Clone)]
pub struct ShardPieceState {
    /// Index of the parameter among the trainable ones (registration order).
    pub param: usize,
    /// First element of the piece, in the parameter's flattened order.
    pub start: usize,
    /// The f32 master values (a flat tensor of the piece's length).
    pub master: Tensor,
    /// The sharded optimizer's state of this piece (empty before its first step).
    pub state: Vec<(String, StateValue)>,
}

impl ZeroRedundancy {
    /// Names of the trainable parameters, in the order pieces refer to them.
    pub fn trainable_names(&self) -> &[String] {
        &self.names
    }

    /// The trainable parameters (the model's own tensors), in the same order.
    pub fn trainable_params(&self) -> &[Tensor] {
        &self.params
    }

    fn layout(&self) -> Result<OptimizerLayout> {
        self.layout.lock().unwrap_or_else(|p| p.into_inner()).clone().ok_or_else(|| DistributedError::ZeroState {
            rank: self.rank(),
            detail: "no optimizer was sharded yet: build it with ZeroRedundancy::shard_optimizer first".into(),
        })
    }

    /// Per trainable parameter, its index in the full optimizer's layout (`None`: not updated).
    pub fn full_optimizer_indices(&self) -> Result<Vec<Option<usize>>> {
        Ok(self.layout()?.full_index)
    }

    /// The full optimizer's parameter groups as its `state_dict` would list them: the
    /// hyper-parameters of `opt`'s groups (the sharded optimizer, whose groups mirror the full
    /// one's), the full optimizer's parameter indices and names.
    pub fn full_param_groups(&self, opt: &dyn Optimizer) -> Result<Vec<GroupState>> {
        let layout = self.layout()?;
        let mine = opt.state_dict()?;
        let mut next = 0usize;
        let mut groups = Vec::with_capacity(mine.param_groups.len());
        for (g, (count, names)) in mine.param_groups.iter().zip(&layout.full_groups) {
            let count = *count;
            groups.push(GroupState {
                hyper: g.hyper.clone(),
                params: (next..next + count).collect(),
                param_names: names.clone(),
            });
            next += count;
        }
        Ok(groups)
    }

    /// This rank's pieces with their master values and the sharded optimizer `opt`'s state.
    pub fn export_shard(&self, opt: &dyn Optimizer) -> Result<Vec<ShardPieceState>> {
        let layout = self.layout()?;
        let mut per_piece: Vec<Vec<(String, StateValue)>> = vec![Vec::new(); self.pieces.len()];
        for (m, entries) in opt.state_dict()?.state {
            if let Some(Some(pi)) = layout.shard_piece.get(m) {
                per_piece[*pi] = entries;
            }
        }
        Ok(self
            .pieces
            .iter()
            .zip(&self.shards)
            .zip(per_piece)
            .map(|((p, s), state)| ShardPieceState { param: p.param, start: p.param_start, master: s.clone(), state })
            .collect())
    }

    /// Overwrite this rank's f32 masters with their values in `weights` (named as the model's
    /// parameters; full precision, as a sharded checkpoint stores them). Needed when the model's
    /// parameters are narrower than the masters (`--zero-comm-dtype bf16`): the masters
    /// [`import_full_state`](Self::import_full_state) re-reads from the parameters would be the
    /// rounded values. A name missing from `weights` keeps what the parameter gave.
    pub fn load_masters<'a>(&self, weights: impl Fn(&str) -> Option<&'a Tensor>) -> Result<()> {
        let _g = no_grad();
        for (piece, shard) in self.pieces.iter().zip(&self.shards) {
            let Some(w) = weights(&self.names[piece.param]) else { continue };
            let numel = self.params[piece.param].numel();
            if w.numel() != numel {
                return Err(DistributedError::ZeroState {
                    rank: self.rank(),
                    detail: format!(
                        "the saved `{}` has {} values, the parameter {numel}",
                        self.names[piece.param],
                        w.numel()
                    ),
                });
            }
            shard.copy_from_slice(&piece_values(w, numel, piece)?)?;
        }
        Ok(())
    }

    /// Resume: with the model's parameters already holding the saved weights (on every rank),
    /// copy them into this rank's shards and load into `opt` (the sharded optimizer) this rank's
    /// pieces of `full`, the optimizer state in the full single-device layout. Tensors of a
    /// parameter's size are cut element-wise; scalars (step counts) are copied to every piece.
    pub fn import_full_state(&self, full: &OptimizerState, opt: &mut dyn Optimizer) -> Result<()> {
        self.reload_shards()?;
        let layout = self.layout()?;
        let mine = opt.state_dict()?;
        if full.param_groups.len() != mine.param_groups.len() {
            return Err(DistributedError::ZeroState {
                rank: self.rank(),
                detail: format!(
                    "it has {} optimizer parameter groups and this optimizer {}",
                    full.param_groups.len(),
                    mine.param_groups.len()
                ),
            });
        }
        let mut groups = mine.param_groups;
        for (g, f) in groups.iter_mut().zip(&full.param_groups) {
            g.hyper = f.hyper.clone();
        }
        let _g = no_grad();
        let mut state = Vec::new();
        for (m, piece) in layout.shard_piece.iter().enumerate() {
            let Some(pi) = *piece else { continue };
            let piece = self.pieces[pi];
            let Some(j) = layout.full_index[piece.param] else { continue };
            let Some(entries) = full.param_state(j) else { continue };
            let numel = self.params[piece.param].numel();
            let device = self.shards[pi].device().clone();
            let mut cut = Vec::with_capacity(entries.len());
            for (name, v) in entries {
                let v = match v {
                    StateValue::Tensor(t) if t.numel() == numel && t.rank() > 0 => {
                        StateValue::Tensor(Tensor::from_vec(piece_values(t, numel, &piece)?, &[piece.len], &device)?)
                    }
                    StateValue::Tensor(t) if t.numel() != 1 => {
                        return Err(DistributedError::ZeroState {
                            rank: self.rank(),
                            detail: format!(
                                "optimizer state `{name}` of parameter `{}` has {} values, the parameter {numel}",
                                self.names[piece.param],
                                t.numel()
                            ),
                        });
                    }
                    other => other.clone(),
                };
                cut.push((name.clone(), v));
            }
            state.push((m, cut));
        }
        opt.load_state_dict(&OptimizerState { state, param_groups: groups })?;
        Ok(())
    }

    /// Every rank says whether its part of `what` (a save, a resume) succeeded: `local_failure`
    /// is this rank's error message, `None` when it succeeded. Returns an error naming the first
    /// *other* rank that failed; `Ok` when all others succeeded (this rank then returns its own
    /// error, if it had one). After any failure the run is marked stopped on every rank, so no
    /// rank waits for another's announcement.
    pub fn agree_all(&self, local_failure: Option<&str>, what: &str) -> Result<()> {
        let statuses = self.comm.all_gather_status(local_failure).inspect_err(|_| self.mark_failed())?;
        if statuses.iter().any(Option::is_some) {
            self.mark_failed();
        }
        let me = self.rank();
        match statuses.iter().enumerate().find(|(r, s)| *r != me && s.is_some()) {
            Some((rank, Some(message))) => {
                Err(DistributedError::PeerFailed { rank, message: format!("{what} failed there: {message}") })
            }
            _ => Ok(()),
        }
    }

    /// Rank 0's `text` on every rank (e.g. the tag of a save).
    pub fn broadcast_text(&self, text: &str) -> Result<String> {
        let bytes = self.comm.broadcast_bytes(text.as_bytes().to_vec()).inspect_err(|_| self.mark_failed())?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
