//! A condition's `status`, typed: Kubernetes API conventions give it three values, as strings,
//! on every kind of condition (a PDDeployment's, a pod's, a readiness gate's).

use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    /// What the API wrote; anything but "True" or "False" is `Unknown`.
    pub fn of(s: &str) -> Self {
        match s {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        }
    }
}

impl From<bool> for Status {
    fn from(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A condition of any kind, read by its status.
pub trait HasStatus {
    fn status(&self) -> Status;

    fn is_true(&self) -> bool {
        self.status() == Status::True
    }

    fn is_false(&self) -> bool {
        self.status() == Status::False
    }
}

impl HasStatus for Condition {
    fn status(&self) -> Status {
        Status::of(&self.status)
    }
}

impl HasStatus for PodCondition {
    fn status(&self) -> Status {
        Status::of(&self.status)
    }
}

impl HasStatus for JobCondition {
    fn status(&self) -> Status {
        Status::of(&self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_values_round_trip_and_anything_else_is_unknown() {
        for s in [Status::True, Status::False, Status::Unknown] {
            assert_eq!(Status::of(s.as_str()), s);
        }
        assert_eq!(Status::of("true"), Status::Unknown);
        assert_eq!(Status::from(true).as_str(), "True");
        let c = PodCondition { type_: "Ready".into(), status: "False".into(), ..Default::default() };
        assert!(c.is_false() && !c.is_true());
    }
}
