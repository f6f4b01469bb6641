//! Connecting to Postgres: the password from the URL or from PGPASSWORD, a wrong one
//! refused as such and never repeated.

use super::*;

/// The password-authenticated role's URL (without its password) and its password, as
/// scripts/with-postgres.sh exports them.
fn password_role() -> (String, String) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: run the Postgres half through `{POSTGRES_RUN}`")
        })
    };
    (
        var("BERTH_TEST_DATABASE_PASSWORD_URL"),
        var("BERTH_TEST_DATABASE_PASSWORD"),
    )
}

fn with_password(url: &str, password: &str) -> String {
    url.replacen("://berth_pw@", &format!("://berth_pw:{password}@"), 1)
}

fn a_password_from_the_url_or_pgpassword_is_used_and_a_wrong_one_refused(_db: &TestDb) {
    let (url, password) = password_role();
    let dir = tempfile::tempdir().unwrap();
    let connect = |config: DatabaseConfig| {
        Store::connect(&config).and_then(|store| {
            store.create_team("t").or_else(|err| match err {
                StoreError::TeamExists { .. } => Ok(store.team_by_name("t")?.unwrap()),
                other => Err(other),
            })
        })
    };

    let in_url = DatabaseConfig::from_url(Some(&with_password(&url, &password)), dir.path());
    connect(in_url.unwrap()).unwrap();
    let from_env = PostgresConfig::parse(&url, Some(&password)).unwrap();
    connect(DatabaseConfig::Postgres(from_env)).unwrap();

    let wrong = "not-the-password-4711";
    let config = DatabaseConfig::from_url(Some(&with_password(&url, wrong)), dir.path());
    let err = connect(config.unwrap()).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, StoreError::DatabaseRejected { .. }),
        "{message}"
    );
    assert!(!message.contains(wrong), "{message}");
    assert!(!format!("{err:?}").contains(wrong));
    assert!(message.contains("berth_pw@"), "names the user: {message}");
}

on_postgres!(a_password_from_the_url_or_pgpassword_is_used_and_a_wrong_one_refused);
