//! Robust statistics for trend detection: median, MAD, Theil–Sen slope with Sen's confidence
//! interval, the Mann–Kendall test with the tie correction (monitoring.md §7.2), and the normal
//! distribution functions they need.

/// Median of `v` (NaN-free). Empty input gives 0.
pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// The `q`-quantile (0..=1) of `v` by linear interpolation. Empty input gives 0.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (s.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
}

/// Scaled median absolute deviation (1.4826·MAD): a robust standard deviation.
pub fn mad_sigma(v: &[f64]) -> f64 {
    let m = median(v);
    let d: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    1.4826 * median(&d)
}

/// Standard normal cumulative distribution.
pub fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// Complementary error function (Numerical Recipes `erfcc`, relative error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// The standard normal quantile `z` with `Φ(z) = p`, by bisection (accurate to 1e-9).
pub fn normal_quantile(p: f64) -> f64 {
    let (mut lo, mut hi) = (-10.0, 10.0);
    for _ in 0..80 {
        let mid = 0.5 * (lo + hi);
        if normal_cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The Mann–Kendall trend test on `y` in order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannKendall {
    /// S = Σ_{i<j} sgn(y_j − y_i).
    pub s: f64,
    /// Var(S) with the tie correction.
    pub var: f64,
    /// The continuity-corrected Z score.
    pub z: f64,
    /// One-sided p-value for an upward trend, 1 − Φ(Z).
    pub p_up: f64,
}

/// Runs the Mann–Kendall test. Floors are often exactly equal (allocator granularity), so ties
/// are corrected for.
pub fn mann_kendall(y: &[f64]) -> MannKendall {
    let n = y.len();
    let mut s = 0.0;
    for i in 0..n {
        for j in i + 1..n {
            s += (y[j] - y[i]).signum() * f64::from(u8::from(y[j] != y[i]));
        }
    }
    let mut sorted = y.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut ties = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && sorted[j + 1] == sorted[i] {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        if t > 1.0 {
            ties += t * (t - 1.0) * (2.0 * t + 5.0);
        }
        i = j + 1;
    }
    let nf = n as f64;
    let var = ((nf * (nf - 1.0) * (2.0 * nf + 5.0) - ties) / 18.0).max(0.0);
    let z = if var <= 0.0 {
        0.0
    } else if s > 0.0 {
        (s - 1.0) / var.sqrt()
    } else if s < 0.0 {
        (s + 1.0) / var.sqrt()
    } else {
        0.0
    };
    MannKendall {
        s,
        var,
        z,
        p_up: 1.0 - normal_cdf(z),
    }
}

/// Exact one-sided p (P(S ≥ `s`) under no trend) of Mann–Kendall's S for `n` ≤ 12 values
/// without ties, from the count of permutations by inversions (S = n(n−1)/2 − 2·inversions).
/// The normal approximation is poor there: 7 values rising steadily give p = 2e-4 exactly,
/// 1.4e-3 approximated.
pub fn mann_kendall_exact_p(n: usize, s: f64) -> Option<f64> {
    if !(2..=12).contains(&n) {
        return None;
    }
    let pairs = n * (n - 1) / 2;
    // counts[k]: permutations of i elements with k inversions.
    let mut counts = vec![0f64; pairs + 1];
    counts[0] = 1.0;
    for i in 2..=n {
        let mut next = vec![0f64; pairs + 1];
        for (k, c) in counts.iter().enumerate() {
            if *c == 0.0 {
                continue;
            }
            for extra in 0..i {
                if k + extra <= pairs {
                    next[k + extra] += c;
                }
            }
        }
        counts = next;
    }
    let total: f64 = counts.iter().sum();
    let max_inv = (pairs as f64 - s) / 2.0;
    if max_inv < 0.0 {
        return Some(0.0);
    }
    let upto = (max_inv.floor() as usize).min(pairs);
    Some(counts[..=upto].iter().sum::<f64>() / total)
}

/// A Theil–Sen fit with Sen's confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TheilSen {
    /// Median of pairwise slopes.
    pub slope: f64,
    /// median(y − slope·x).
    pub intercept: f64,
    /// Lower end of the interval at the requested level.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
}

/// Theil–Sen slope of `(x, y)`, with Sen's interval from the Mann–Kendall variance at two-sided
/// level `1 − 2·alpha` (`var_s` is the tie-corrected Var(S) of `y`).
pub fn theil_sen(x: &[f64], y: &[f64], var_s: f64, alpha: f64) -> TheilSen {
    let n = x.len().min(y.len());
    let mut slopes = Vec::with_capacity(n * n.saturating_sub(1) / 2);
    for i in 0..n {
        for j in i + 1..n {
            let dx = x[j] - x[i];
            if dx != 0.0 {
                slopes.push((y[j] - y[i]) / dx);
            }
        }
    }
    if slopes.is_empty() {
        return TheilSen {
            slope: 0.0,
            intercept: median(y),
            lo: f64::NEG_INFINITY,
            hi: f64::INFINITY,
        };
    }
    slopes.sort_by(f64::total_cmp);
    let m = slopes.len();
    let slope = if m % 2 == 1 {
        slopes[m / 2]
    } else {
        0.5 * (slopes[m / 2 - 1] + slopes[m / 2])
    };
    let res: Vec<f64> = (0..n).map(|i| y[i] - slope * x[i]).collect();
    let intercept = median(&res);
    let c = normal_quantile(1.0 - alpha) * var_s.sqrt();
    let mf = m as f64;
    let m1 = ((mf - c) / 2.0).round();
    let m2 = ((mf + c) / 2.0).round();
    let lo = if m1 >= 1.0 {
        slopes[(m1 as usize - 1).min(m - 1)]
    } else {
        f64::NEG_INFINITY
    };
    let hi = if (m2 as usize) < m {
        slopes[m2 as usize]
    } else {
        f64::INFINITY
    };
    TheilSen {
        slope,
        intercept,
        lo,
        hi,
    }
}

/// Ordinary least squares `(slope, intercept, sse)`.
pub fn ols(x: &[f64], y: &[f64]) -> (f64, f64, f64) {
    let n = x.len() as f64;
    if n < 2.0 {
        return (0.0, y.first().copied().unwrap_or(0.0), 0.0);
    }
    let mx = x.iter().sum::<f64>() / n;
    let my = y.iter().sum::<f64>() / n;
    let mut sxy = 0.0;
    let mut sxx = 0.0;
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
    }
    let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let a = my - b * mx;
    let sse = x.iter().zip(y).map(|(p, q)| (q - a - b * p).powi(2)).sum();
    (b, a, sse)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_functions() {
        assert!((normal_cdf(1.959_964) - 0.975).abs() < 1e-6);
        assert!((normal_quantile(0.999) - 3.090_232).abs() < 1e-4);
    }

    #[test]
    fn mk_and_sen() {
        let x: Vec<f64> = (0..20).map(f64::from).collect();
        let y: Vec<f64> = x
            .iter()
            .map(|v| 2.0 * v + if *v as i32 % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let mk = mann_kendall(&y);
        assert!(mk.p_up < 1e-6);
        let ts = theil_sen(&x, &y, mk.var, 0.025);
        assert!((ts.slope - 2.0).abs() < 0.2, "{ts:?}");
        assert!(ts.lo <= ts.slope && ts.slope <= ts.hi);
        let flat = mann_kendall(&[1.0; 10]);
        assert_eq!(flat.s, 0.0);
        assert!(flat.p_up > 0.49);
    }

    #[test]
    fn exact_mann_kendall() {
        // 7 rising values: only the identity permutation has S = 21.
        let p = mann_kendall_exact_p(7, 21.0).unwrap_or(1.0);
        assert!((p - 1.0 / 5040.0).abs() < 1e-12, "{p}");
        // S = 0 with 4 values: half the mass or more.
        let p = mann_kendall_exact_p(4, 0.0).unwrap_or(0.0);
        assert!((0.5..=0.7).contains(&p), "{p}");
        assert_eq!(mann_kendall_exact_p(40, 10.0), None);
    }
}
