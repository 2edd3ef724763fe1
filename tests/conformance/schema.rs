//! Tables of the user's own, checked against what this version of orderly needs.

use orderly::{Engine, Error, Outcome};

use super::{Backend, OrderEvent, OrderMachine, OrderState};

/// A history table of the user's own made before `write_id` existed: every transition
/// (and `check_tables`) answers one error naming the table, the column and the statement
/// that adds it, and nothing is written; once that statement has run, transitions go
/// through.
pub async fn a_table_without_write_id_is_refused_with_its_fix<B: Backend>(b: &B) {
    let store = b.custom_store().await;
    b.exec("ALTER TABLE shop_order_log DROP COLUMN write_id")
        .await;
    let engine = Engine::<OrderMachine, _>::new(store).unwrap();
    engine.create(1).await.unwrap();
    let fix = match engine.transition(1, OrderEvent::Pay, "p-1").await {
        Err(Error::MissingColumn { table, column, fix }) => {
            assert_eq!(
                (table.as_str(), column.as_str()),
                ("shop_order_log", "write_id")
            );
            fix
        }
        other => panic!("{other:?}"),
    };
    assert!(
        fix.starts_with("ALTER TABLE ") && fix.contains("write_id"),
        "{fix}"
    );
    assert!(
        matches!(engine.check_tables().await, Err(Error::MissingColumn { ref column, .. }) if column == "write_id")
    );
    assert_eq!(
        b.scalar("SELECT count(*) FROM shop_order_log").await,
        0,
        "nothing written"
    );
    assert_eq!(engine.get(1).await.unwrap().state, OrderState::Created);

    b.exec(&fix).await;
    engine.check_tables().await.unwrap();
    let applied = engine.transition(1, OrderEvent::Pay, "p-1").await.unwrap();
    assert!(matches!(applied, Outcome::Applied { .. }), "{applied:?}");
}
