//! Named metrics of a training or evaluation pass (`loss`, `accuracy`, …), in the order they were
//! first reported, and which way is better for a tracked one.

/// Which way a metric improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Lower is better (a loss, a perplexity).
    Minimize,
    /// Higher is better (an accuracy).
    Maximize,
}

impl Goal {
    /// Whether `value` is strictly better than `best`.
    pub fn improves(self, value: f64, best: f64) -> bool {
        match self {
            Goal::Minimize => value < best,
            Goal::Maximize => value > best,
        }
    }
}

/// `(name, value)` pairs; adding to a name that exists sums into it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics(Vec<(String, f64)>);

impl Metrics {
    pub fn new() -> Metrics {
        Metrics(Vec::new())
    }

    /// `name` set to `value` (replacing an earlier value).
    pub fn with(mut self, name: impl Into<String>, value: f64) -> Metrics {
        self.set(name, value);
        self
    }

    pub fn set(&mut self, name: impl Into<String>, value: f64) {
        let name = name.into();
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }

    /// Adds `value` to `name` (from 0 when new).
    pub fn add(&mut self, name: &str, value: f64) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 += value,
            None => self.0.push((name.to_string(), value)),
        }
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(n, v)| (n.as_str(), *v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_sums_into_a_name_and_goals_compare_strictly() {
        let mut m = Metrics::new().with("loss", 2.0);
        m.add("correct", 3.0);
        m.add("correct", 4.0);
        m.set("loss", 1.5);
        assert_eq!(m.get("correct"), Some(7.0));
        assert_eq!(m.get("loss"), Some(1.5));
        assert_eq!(m.names(), vec!["loss", "correct"]);
        assert!(Goal::Minimize.improves(1.0, 1.5) && !Goal::Minimize.improves(1.5, 1.5));
        assert!(Goal::Maximize.improves(0.9, 0.8) && !Goal::Maximize.improves(0.8, 0.8));
    }
}
