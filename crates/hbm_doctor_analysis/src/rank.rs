//! The learned re-ranker of `explain`'s causes: the rules propose every cause their evidence
//! supports (with a hand-set prior), and a small linear model fitted on the labelled corpus orders
//! them.
//!
//! Why: the hand priors were set case by case on the posts known at the time, and on posts that
//! arrived later (measured blind, docs/accuracy.md) the first cause was right about a third of the
//! time, no better than always answering "the batch". The order among causes that all have
//! evidence is a question of base rates given the evidence (which family of message, which stage,
//! which figures, which hints), and base rates are what a model fitted on hundreds of labelled
//! threads knows better than hand-set numbers.
//!
//! What it may do: reorder the candidates the rules proposed. It never adds a cause (every cause
//! shown keeps the evidence sentence a rule wrote) and never removes one.
//!
//! The model (`data/ranker.json`, fitted by `scripts/train_ranker.py`, which also prints its
//! figures under cross-validation grouped by batch of posts): for a candidate cause `c` of a case
//! with features `F` (strings such as `fam:pytorch_cuda_oom`, `stage:eval`, `req_lim:lt0.1`) and
//! rules `R(c)` that proposed it with the best hand score `h(c)`,
//!
//! `u(c) = w_hand * h(c) + bias[c] + sum(cross[c|f] for f in F) + sum(rule[r] for r in R(c))`
//!
//! and the causes are ordered by `u`, ties by the hand order. An empty model is the hand order.
//!
//! Invariant: pure and deterministic; the weights are looked up, never iterated in hash order.

use crate::model::{Category, CauseKind};
use hbm_doctor_log::{Event, Phase};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// One candidate cause as the rules proposed it: the input of the re-ranker (and of its training:
/// the accuracy harness writes these out, `HBM_DOCTOR_RANK_DUMP`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The cause.
    pub cause: CauseKind,
    /// The best hand-set score among the rules that proposed it.
    pub hand: f64,
    /// The rules that proposed it (`function@prior`).
    pub rules: Vec<String>,
}

/// What the re-ranker sees of one diagnosis.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RankInput {
    /// The case's features (family, stage, figures as buckets, hints).
    pub features: Vec<String>,
    /// The candidates in the hand order.
    pub candidates: Vec<Candidate>,
}

// Hand scores are finite sums of finite priors: equality is total on them.
impl Eq for Candidate {}
impl Eq for RankInput {}

/// The fitted weights (`data/ranker.json`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Model {
    /// Weight of the hand score.
    #[serde(default = "one")]
    pub hand: f64,
    /// Per cause.
    #[serde(default)]
    pub bias: BTreeMap<String, f64>,
    /// Per `cause|feature`.
    #[serde(default)]
    pub cross: BTreeMap<String, f64>,
    /// Per rule id.
    #[serde(default)]
    pub rule: BTreeMap<String, f64>,
}

fn one() -> f64 {
    1.0
}

/// The model shipped with this build (an empty or unreadable file is the hand order).
pub fn shipped() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        serde_json::from_str(include_str!("../data/ranker.json")).unwrap_or(Model {
            hand: 1.0,
            ..Model::default()
        })
    })
}

impl Model {
    /// The learned utility of one candidate.
    pub fn utility(&self, features: &[String], c: &Candidate) -> f64 {
        let name = c.cause.as_str();
        let mut u = self.hand * c.hand + self.bias.get(name).copied().unwrap_or(0.0);
        let mut key = String::with_capacity(48);
        for f in features {
            key.clear();
            key.push_str(name);
            key.push('|');
            key.push_str(f);
            u += self.cross.get(&key).copied().unwrap_or(0.0);
        }
        for r in &c.rules {
            u += self.rule.get(r).copied().unwrap_or(0.0);
        }
        u
    }

    /// The candidates' indices, best first (ties keep the hand order).
    pub fn order(&self, input: &RankInput) -> Vec<usize> {
        let u: Vec<f64> = input
            .candidates
            .iter()
            .map(|c| self.utility(&input.features, c))
            .collect();
        let mut idx: Vec<usize> = (0..u.len()).collect();
        idx.sort_by(|&a, &b| u[b].total_cmp(&u[a]).then(a.cmp(&b)));
        idx
    }
}

fn name<T: Serialize>(t: &T) -> String {
    serde_json::to_value(t)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| "null".into())
}

/// A ratio as a coarse bucket (`lt0.01`, `lt0.1`, ...): the model learns per bucket.
fn bucket(part: u64, whole: u64) -> &'static str {
    if whole == 0 {
        return "na";
    }
    let r = part as f64 / whole as f64;
    match r {
        r if r < 0.01 => "lt0.01",
        r if r < 0.05 => "lt0.05",
        r if r < 0.2 => "lt0.2",
        r if r < 0.5 => "lt0.5",
        r if r < 1.0 => "lt1",
        r if r < 2.5 => "lt2.5",
        _ => "ge2.5",
    }
}

fn gib_bucket(b: u64) -> &'static str {
    let g = b as f64 / (1u64 << 30) as f64;
    match g {
        g if g <= 4.5 => "le4.5",
        g if g <= 12.5 => "le12",
        g if g <= 24.5 => "le24",
        g if g <= 49.0 => "le48",
        _ => "gt48",
    }
}

/// The case's features: only what the event states or the parser read from the text around it.
pub fn features(e: &Event, category: Category, limit: Option<u64>) -> Vec<String> {
    let mut f = vec![
        format!("fam:{}", name(&e.family)),
        format!("backend:{}", name(&e.backend)),
        format!("fw:{}", name(&e.framework)),
        format!("phase:{}", name(&e.phase)),
        format!("space:{}", name(&e.memory_space)),
        format!("stage:{}", name(&e.stage)),
        format!("cat:{}", category.as_str()),
    ];
    let mut flag = |on: bool, s: &str| {
        if on {
            f.push(s.to_string());
        }
    };
    flag(e.requested_bytes.is_some(), "has:requested");
    flag(limit.is_some(), "has:limit");
    flag(e.free_bytes.is_some(), "has:free");
    flag(e.used_bytes.is_some(), "has:used");
    flag(!e.allocations.is_empty(), "has:allocations");
    flag(e.arguments_bytes.is_some(), "has:arguments");
    flag(e.reserved_bytes.is_some(), "has:reserved");
    flag(e.told, "told");
    flag(e.partial, "partial");
    flag(e.repeats > 1, "repeats");
    flag(e.model_params.is_some(), "hint:model_params");
    flag(e.batch_tried.is_some(), "hint:batch_tried");
    flag(e.holder_named.is_some(), "hint:holder_named");
    flag(e.growth_said.is_some(), "hint:growth_said");
    flag(e.device_named_bytes.is_some(), "hint:device_named");
    flag(e.accelerator.is_some(), "hint:accelerator");
    flag(e.pool_setting.is_some(), "hint:pool_setting");
    flag(e.failing_op.is_some(), "hint:failing_op");
    flag(e.step.is_some_and(|s| s > 1), "hint:step_after_first");
    if let Some(l) = limit.or(e.device_named_bytes) {
        f.push(format!("card:{}", gib_bucket(l)));
        if let Some(r) = e.requested_bytes {
            f.push(format!("req_card:{}", bucket(r, l)));
        }
        if let Some(fr) = e.free_bytes {
            f.push(format!("free_card:{}", bucket(fr, l)));
        }
        if let Some(u) = e.used_bytes.or(e.allocated_bytes) {
            f.push(format!("used_card:{}", bucket(u, l)));
        }
        if let Some(a) = e.arguments_bytes {
            f.push(format!("args_card:{}", bucket(a, l)));
        }
        // Held outside this allocator: the limit less what it holds and what is free.
        if let (Some(p), Some(fr)) = (e.process_bytes.or(e.allocated_bytes), e.free_bytes) {
            let outside = l.saturating_sub(p).saturating_sub(fr);
            f.push(format!("outside_card:{}", bucket(outside, l)));
        }
    }
    if let (Some(r), Some(fr)) = (e.requested_bytes, e.free_bytes) {
        f.push(format!("req_free:{}", bucket(r, fr.max(1))));
    }
    if let Some(p) = e.model_params {
        let b = p.saturating_mul(u64::from(e.param_bits.unwrap_or(16))) / 8;
        f.push(format!("model:{}", gib_bucket(b)));
    }
    if e.phase == Phase::Runtime && e.stage.is_none() {
        f.push("stage:unstated_runtime".into());
    }
    f
}

/// Reorders the candidates with `model`; the hand order where the model is empty.
pub fn rerank<T>(model: &Model, input: &RankInput, items: Vec<T>) -> Vec<T> {
    let order = model.order(input);
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|i| slots.get_mut(i).and_then(Option::take))
        .collect()
}

/// Puts `causes` back in the rules' own order (where `input` lists them): with a dump joined, the
/// measured evidence decides, and the re-ranker, fitted on texts without dumps, stays out.
pub fn hand_order(input: &RankInput, causes: &mut [crate::model::Cause]) {
    let pos = |k: CauseKind| {
        input
            .candidates
            .iter()
            .position(|c| c.cause == k)
            .unwrap_or(usize::MAX)
    };
    causes.sort_by_key(|c| pos(c.cause));
}
