//! The table: its definition, and `create_table` for tests and quick starts.

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};
use idem_core::StoreError;

use crate::error::classify;
use crate::item::attr;
use crate::store::DynamoStore;

impl DynamoStore {
    /// Creates the table if it does not exist, and enables TTL on it.
    ///
    /// The definition, for those who create tables with their own tools:
    ///
    /// - partition key `pk`, type `S` (no sort key): `<n>:<tenant>:<key>`,
    ///   see [`item_key`](crate::item_key);
    /// - billing mode on demand (`PAY_PER_REQUEST`) here; provisioned works too;
    /// - Time to Live enabled on the attribute `ttl` (epoch seconds). TTL
    ///   deletes lazily, so the store checks retention (`exp`, epoch
    ///   milliseconds) on every read and write itself.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`] from DynamoDB.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let created = self
            .client
            .create_table()
            .table_name(self.table.as_str())
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(attr::PK)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(|e| StoreError::backend("table definition", e))?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(attr::PK)
                    .key_type(KeyType::Hash)
                    .build()
                    .map_err(|e| StoreError::backend("table definition", e))?,
            )
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {}
            Err(error) => match error.as_service_error() {
                Some(CreateTableError::ResourceInUseException(_)) => return Ok(()),
                _ => return Err(classify("create table", error)),
            },
        }
        self.wait_until_active().await?;
        self.client
            .update_time_to_live()
            .table_name(self.table.as_str())
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(attr::TTL)
                    .enabled(true)
                    .build()
                    .map_err(|e| StoreError::backend("ttl specification", e))?,
            )
            .send()
            .await
            .map_err(|e| classify("enable ttl", e))?;
        Ok(())
    }

    async fn wait_until_active(&self) -> Result<(), StoreError> {
        use aws_sdk_dynamodb::types::TableStatus;
        for _ in 0..600 {
            let described = self
                .client
                .describe_table()
                .table_name(self.table.as_str())
                .send()
                .await
                .map_err(|e| classify("describe table", e))?;
            if described.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(StoreError::unavailable("the table did not become active"))
    }
}
