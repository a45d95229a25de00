//! The one runtime table: what build.rs found in runtimes/ and base-images/, compiled in.
//! [`super::Catalog`] reads the runtime files, `crate::base::recipe` the recipes and locks.

include!(concat!(env!("OUT_DIR"), "/runtimes.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_runtime_has_a_base_image_and_every_base_image_a_runtime() {
        let runtimes: Vec<&str> = RUNTIMES.iter().map(|(n, _)| *n).collect();
        let bases: Vec<&str> = BASE_IMAGES.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(runtimes, bases);
        assert!(runtimes.contains(&"nodejs22"), "{runtimes:?}");
    }
}
