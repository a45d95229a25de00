#![allow(clippy::unwrap_used)]
use super::*;

fn v(s: &str) -> Version {
    Version::parse(s).unwrap()
}

#[test]
fn versions_order_as_pep_440_says() {
    let sorted = [
        "1.0.dev1",
        "1.0a1",
        "1.0a2.dev1",
        "1.0a2",
        "1.0b1",
        "1.0rc1",
        "1.0",
        "1.0+local",
        "1.0.post1.dev1",
        "1.0.post1",
        "1.1",
        "1!0.5",
    ];
    for pair in sorted.windows(2) {
        assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
    }
    assert!(v("1.0") == v("1.0.0"));
    assert!(v("2.9.0.post0") > v("2.9.0"));
    assert!(v("1.0-1") == v("1.0.post1"));
    assert!(v("1.0RC1") == v("1.0rc1"));
    assert!(Version::parse("1.0+").is_err());
    assert!(Version::parse("one").is_err());
    assert!(Version::parse("1.0foo").is_err());
}

#[test]
fn specifiers_hold_as_packaging_decides() {
    let yes = [
        ("2.32.3", ">=2.17,<3"),
        ("3.4.1", "<4,>=2"),
        ("1.26.0", "!=1.25.*"),
        ("2.2", "~=2.1"),
        ("2.1.5", "~=2.1.0"),
        ("1.0+abc", "==1.0"),
        ("3.13.5", ">=3.8"),
        ("1.0rc1", ">=0.9"),
        ("1.0", ""),
    ];
    let no = [
        ("3.0", "~=2.1"),
        ("2.2.0", "~=2.1.0"),
        ("1.0rc1", "<1.0"),
        ("1.0.post1", ">1.0"),
        ("1.0", "==1.0+abc"),
        ("1.25.3", "!=1.25.*"),
        ("3.13.0", "!=3.13.0"),
    ];
    for (version, spec) in yes {
        assert!(satisfies(&v(version), spec).unwrap(), "{version} {spec}");
    }
    for (version, spec) in no {
        assert!(!satisfies(&v(version), spec).unwrap(), "{version} {spec}");
    }
    assert!(satisfies(&v("1.0"), "===1.0").is_err());
}

#[test]
fn dependency_lines_parse() {
    assert_eq!(
        dependency("PySocks!=1.5.7,>=1.5.6; extra == \"socks\"").unwrap(),
        Dependency {
            name: "pysocks".into(),
            extras: vec![],
            specifiers: "!=1.5.7,>=1.5.6".into(),
            marker: Some("extra == \"socks\"".into()),
        }
    );
    let d = dependency("Charset_Normalizer[Unicode_Backport] (<4,>=2)").unwrap();
    assert_eq!(
        (d.name.as_str(), d.extras, d.specifiers.as_str()),
        (
            "charset-normalizer",
            vec!["unicode-backport".to_string()],
            "<4,>=2"
        )
    );
    assert!(dependency("pkg @ https://example.com/p.whl").is_err());
}

#[test]
fn markers_evaluate_for_the_runtime() {
    let env = Environment {
        python_full_version: "3.13.0".into(),
        machine: "x86_64".into(),
        extra: String::new(),
    };
    for (marker, want) in [
        ("python_version < \"3.10\"", false),
        ("python_version >= '3.8' and sys_platform == 'linux'", true),
        (
            "(os_name == 'nt' or platform_machine == 'x86_64') and extra == 'socks'",
            false,
        ),
        ("'linux' in sys_platform", true),
        ("platform_python_implementation != 'PyPy'", true),
        ("python_full_version >= '3.13.1'", false),
    ] {
        assert_eq!(marker_holds(marker, &env).unwrap(), want, "{marker}");
    }
    let socks = Environment {
        extra: "socks".into(),
        ..env.clone()
    };
    assert!(marker_holds("extra == \"SOCKS\"", &socks).unwrap());
    assert!(marker_holds("platform_release >= '5'", &env).is_err());
    // A `.*` right side is a specifier, as packaging reads it.
    assert!(marker_holds("python_version == '3.*'", &env).unwrap());
    assert!(!marker_holds("python_version != '3.13.*'", &env).unwrap());
    // A version specifier against what is no version: packaging fails, so must kiln.
    assert!(marker_holds("platform_machine == '1'", &env).is_err());
    let deep = format!(
        "{}os_name == 'posix'{}",
        "(".repeat(10_000),
        ")".repeat(10_000)
    );
    assert!(marker_holds(&deep, &env).is_err());
    assert!(marker_holds("python_version <", &env).is_err());
}
