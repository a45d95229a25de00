//! Kubernetes' name rules (apimachinery `util/validation`), each returning what is wrong in
//! Kubernetes' own words, so a message reads the same as the API server's would.

/// A DNS-1035 label: Service names (a Function's name names its Service).
pub fn dns1035_label(s: &str) -> Result<(), String> {
    const FORMAT: &str = "a DNS-1035 label must consist of lower case alphanumeric characters \
        or '-', start with an alphabetic character, and end with an alphanumeric character \
        (e.g. 'my-name', or 'abc-123')";
    if s.len() > 63 {
        return Err(format!(
            "must be no more than 63 characters (it has {})",
            s.len()
        ));
    }
    let ok = s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars().all(lower_alnum_or_dash);
    if ok { Ok(()) } else { Err(FORMAT.into()) }
}

/// A DNS-1123 label: namespaces.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    const FORMAT: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
        characters or '-', and must start and end with an alphanumeric character (e.g. \
        'my-name', or '123-abc')";
    if s.len() > 63 {
        return Err(format!(
            "must be no more than 63 characters (it has {})",
            s.len()
        ));
    }
    if is_label(s) {
        Ok(())
    } else {
        Err(FORMAT.into())
    }
}

/// A DNS-1123 subdomain: Secret names, label and annotation key prefixes.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    const FORMAT: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
        alphanumeric characters, '-' or '.', and must start and end with an alphanumeric \
        character (e.g. 'example.com')";
    if s.len() > 253 {
        return Err(format!(
            "must be no more than 253 characters (it has {})",
            s.len()
        ));
    }
    if s.split('.').all(is_label) {
        Ok(())
    } else {
        Err(FORMAT.into())
    }
}

/// A qualified name, `[prefix/]name`: label and annotation keys.
pub fn qualified_name(s: &str) -> Result<(), String> {
    const FORMAT: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', \
        and must start and end with an alphanumeric character (e.g. 'MyName', 'my.name', or \
        '123-abc'), with an optional DNS subdomain prefix and '/' (e.g. \
        'example.com/MyName')";
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        dns1123_subdomain(prefix).map_err(|e| format!("prefix part {e}"))?;
    }
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Err(format!(
            "name part must be no more than 63 characters (it has {})",
            name.len()
        ));
    }
    if is_label_value(name) {
        Ok(())
    } else {
        Err(FORMAT.into())
    }
}

/// A label value: empty, or up to 63 of `[A-Za-z0-9._-]` starting and ending alphanumeric.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!(
            "must be no more than 63 characters (it has {})",
            s.len()
        ));
    }
    if s.is_empty() || is_label_value(s) {
        Ok(())
    } else {
        Err(
            "a valid label must be an empty string or consist of alphanumeric characters, \
             '-', '_' or '.', and must start and end with an alphanumeric character (e.g. \
             'MyValue', or 'my_value', or '12345')"
                .into(),
        )
    }
}

/// An environment variable name (`IsEnvVarName`).
pub fn env_var_name(s: &str) -> Result<(), String> {
    let ok = s.starts_with(|c: char| c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_'))
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if ok {
        Ok(())
    } else {
        Err(
            "a valid environment variable name must consist of alphabetic characters, \
             digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name', \
             'MY_ENV.NAME', or 'MyEnvName1')"
                .into(),
        )
    }
}

/// A ConfigMap or Secret key (`IsConfigMapKey`).
pub fn config_map_key(s: &str) -> Result<(), String> {
    if s.len() > 253 {
        return Err(format!(
            "must be no more than 253 characters (it has {})",
            s.len()
        ));
    }
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        && s != "."
        && s != ".."
        && !s.starts_with("..");
    if ok {
        Ok(())
    } else {
        Err(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.', \
             and must not be '.' or '..' or start with '..' (e.g. 'key.name', or 'KEY_NAME', \
             or 'key-name')"
                .into(),
        )
    }
}

fn lower_alnum_or_dash(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

fn is_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(lower_alnum_or_dash)
}

fn is_label_value(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_follow_kubernetes() {
        assert!(dns1035_label("hello-1").is_ok());
        for bad in ["1hello", "Hello", "hello-", "", "he_llo", &"a".repeat(64)] {
            assert!(dns1035_label(bad).is_err(), "{bad:?}");
        }
        assert!(dns1123_label("1team").is_ok());
        assert!(dns1123_label("-team").is_err());
        assert!(dns1123_subdomain("my.secret-1").is_ok());
        for bad in ["My", "a..b", ".a", "a.", "a_b", ""] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
        assert!(dns1123_subdomain(&"a.".repeat(127)).is_err());
    }

    #[test]
    fn qualified_names_and_label_values_follow_kubernetes() {
        for good in ["app", "app.kubernetes.io/name", "A_b.c-1", "x/Y"] {
            assert!(qualified_name(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            "/x",
            "x/",
            "a/b/c",
            "-a",
            "a b",
            "Example.com/x",
            &"n".repeat(64),
        ] {
            assert!(qualified_name(bad).is_err(), "{bad:?}");
        }
        assert!(label_value("").is_ok());
        assert!(label_value("v1.2_3-x").is_ok());
        assert!(label_value("-x").is_err());
        assert!(label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn env_names_and_keys_follow_kubernetes() {
        for good in ["A", "_x", "my.env-name", "-dash", "MyEnvName1"] {
            assert!(env_var_name(good).is_ok(), "{good:?}");
        }
        for bad in ["", "1BAD", "A=B", "A B", "é"] {
            assert!(env_var_name(bad).is_err(), "{bad:?}");
        }
        assert!(config_map_key("token.txt").is_ok());
        for bad in ["", ".", "..", "..x", "a/b"] {
            assert!(config_map_key(bad).is_err(), "{bad:?}");
        }
    }
}
