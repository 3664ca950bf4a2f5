//! What every DynamoDB store has alike, written once: its inner part (the
//! client and the checked settings, inside the store's layer) and its
//! constructors and accessors.

/// The store `$ty` (its trait forwarded by `$forward` to its layer), its
/// inner part `$inner`, and `new` (on `$default_table`, with
/// `$default_max` as its response limit), `with_options` (from `$options`,
/// a `part_options!` type), `table` and `client`.
macro_rules! dynamo_part {
    (
        $(#[$doc:meta])*
        pub struct $ty:ident => $field:ident: $inner:ident, $forward:ident,
        $options:ident, $default_table:ident, $default_max:expr, $what:literal
    ) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $ty {
            $field: idem_core::store::Layered<$inner>,
        }

        idem_core::store::$forward!($ty => $field);

        /// The client and the settings, inside the store's layer. Its trait
        /// implementation sets no time limit of its own: the layer's is the
        /// one.
        #[derive(Clone)]
        struct $inner {
            client: ::aws_sdk_dynamodb::Client,
            settings: $crate::options::Settings,
        }

        impl $inner {
            fn table(&self) -> &str {
                &self.settings.table
            }

            /// Now, by the store's clock (the service's, or the caller's
            /// the options set), as far as it is synced.
            fn now(&self) -> idem_core::store::Timestamp {
                self.settings.clock.now()
            }

            /// Now, by the store's clock, synced first: the service's
            /// clock asks DynamoDB once if no response told it the time.
            async fn synced_now(&self) -> Result<idem_core::store::Timestamp, idem_core::StoreError> {
                if let Some(service) = &self.settings.service {
                    service.sync(&self.client, idem_core::Operation::Now).await?;
                }
                Ok(self.now())
            }
        }

        impl ::std::fmt::Debug for $inner {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("table", &self.settings.table)
                    .field("clock", &self.settings.clock)
                    .field("max_response_bytes", &self.settings.max_response_bytes)
                    .field("operation_timeout", &self.settings.layer.timeout())
                    .finish_non_exhaustive()
            }
        }

        impl $ty {
            #[doc = concat!("A ", $what, " on the table [`", stringify!($default_table), "`](crate::", stringify!($default_table), "), with the default options, on the system clock.")]
            ///
            /// ```no_run
            /// # fn example(config: idem_dynamo::aws_sdk_dynamodb::Config) {
            #[doc = concat!("let store = idem_dynamo::", stringify!($ty), "::new(idem_dynamo::aws_sdk_dynamodb::Client::from_conf(config));")]
            #[doc = concat!("assert_eq!(store.table(), idem_dynamo::", stringify!($default_table), ");")]
            /// # }
            /// ```
            pub fn new(client: ::aws_sdk_dynamodb::Client) -> Self {
                let settings = $crate::options::Settings::on($crate::$default_table, $default_max);
                Self::from_settings(client, settings)
            }

            #[doc = concat!("A ", $what, " with `options`.")]
            ///
            /// ```no_run
            #[doc = concat!("use idem_dynamo::{aws_sdk_dynamodb, ", stringify!($ty), ", ", stringify!($options), "};")]
            ///
            /// # fn example(config: aws_sdk_dynamodb::Config) -> Result<(), idem_core::StoreError> {
            /// let client = aws_sdk_dynamodb::Client::from_conf(config);
            #[doc = concat!("let store = ", stringify!($ty), "::with_options(client, ", stringify!($options), "::default().table(\"payments-idem\"))?;")]
            /// # let _ = store;
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// [`StoreError::InvalidInput`](idem_core::StoreError::InvalidInput)
            /// if the table name breaks DynamoDB's rules, the response limit
            /// is out of its range, or the operation timeout is zero.
            pub fn with_options(
                client: ::aws_sdk_dynamodb::Client,
                options: $options,
            ) -> Result<Self, idem_core::StoreError> {
                Ok(Self::from_settings(client, options.validate()?))
            }

            fn from_settings(
                client: ::aws_sdk_dynamodb::Client,
                settings: $crate::options::Settings,
            ) -> Self {
                let layer = settings.layer.clone();
                // The service's clock reads every response of the part's
                // client.
                let client = match &settings.service {
                    Some(service) => ::aws_sdk_dynamodb::Client::from_conf(
                        client.config().to_builder().interceptor(service.interceptor()).build(),
                    ),
                    None => client,
                };
                Self {
                    $field: idem_core::store::Layered::with_layer($inner { client, settings }, layer),
                }
            }

            fn parts(&self) -> &$inner {
                self.$field.get_ref()
            }

            /// The table's name.
            ///
            /// ```no_run
            #[doc = concat!("# fn example(store: idem_dynamo::", stringify!($ty), ") {")]
            /// println!("kept in {}", store.table());
            /// # }
            /// ```
            pub fn table(&self) -> &str {
                &self.parts().settings.table
            }

            /// The client.
            ///
            /// ```no_run
            #[doc = concat!("# async fn example(store: idem_dynamo::", stringify!($ty), ") -> Result<(), Box<dyn std::error::Error>> {")]
            /// let described = store.client().describe_table().table_name(store.table()).send().await?;
            /// # let _ = described;
            /// # Ok(()) }
            /// ```
            pub fn client(&self) -> &::aws_sdk_dynamodb::Client {
                &self.parts().client
            }
        }
    };
}

pub(crate) use dynamo_part;

/// What every DynamoDB store is: durable, sharing `TransactWriteItems`, on
/// a clock read in this process ([`ClockSource::Caller`](idem_core::store::ClockSource::Caller)),
/// whether the service's (computed here from DynamoDB's answers, so callers
/// agree within about a second) or the caller's own: a cache in front
/// reads it without a request, and judges by it on every hit.
pub(crate) fn capabilities(max_response_bytes: usize) -> idem_core::store::Capabilities {
    use idem_core::store::{Capabilities, ClockSource, Durability, TransactionSharing};
    Capabilities::new(
        crate::error::STORE,
        TransactionSharing::TransactItems,
        Durability::Durable,
        ClockSource::Caller,
        max_response_bytes,
    )
}

/// A key schema element of a table or index being created.
pub(crate) fn key_element(
    name: &str,
    key_type: aws_sdk_dynamodb::types::KeyType,
) -> Result<aws_sdk_dynamodb::types::KeySchemaElement, idem_core::StoreError> {
    aws_sdk_dynamodb::types::KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .map_err(|e| crate::error::build_failure(idem_core::Operation::Setup, e))
}

/// An attribute definition of a table being created.
pub(crate) fn attribute_definition(
    name: &str,
    kind: aws_sdk_dynamodb::types::ScalarAttributeType,
) -> Result<aws_sdk_dynamodb::types::AttributeDefinition, idem_core::StoreError> {
    aws_sdk_dynamodb::types::AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(|e| crate::error::build_failure(idem_core::Operation::Setup, e))
}

/// Sends `create` (a table with its indexes), then waits until the table is
/// active, whoever created it.
pub(crate) async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    create: aws_sdk_dynamodb::operation::create_table::builders::CreateTableFluentBuilder,
) -> Result<(), idem_core::StoreError> {
    use aws_sdk_dynamodb::operation::create_table::CreateTableError;
    match create.send().await {
        // Created by someone else (another test, another instance): it
        // may still be creating, so wait for it all the same.
        Err(error)
            if matches!(
                error.as_service_error(),
                Some(CreateTableError::ResourceInUseException(_))
            ) => {}
        Err(error) => {
            return Err(crate::error::classify(idem_core::Operation::Setup, error));
        }
        Ok(_) => {}
    }
    wait_until_active(client, table).await
}

/// Waits until `table` is active, for a minute at most.
pub(crate) async fn wait_until_active(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), idem_core::StoreError> {
    for _ in 0..600 {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| crate::error::classify(idem_core::Operation::Setup, e))?;
        if described.table().and_then(|t| t.table_status())
            == Some(&aws_sdk_dynamodb::types::TableStatus::Active)
        {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(idem_core::StoreError::unavailable(
        crate::error::STORE,
        idem_core::Operation::Setup,
        "the table did not become active within a minute",
    ))
}

/// Up to `limit` items of `index` of `table` matching the key `condition`
/// (its names taken from it, its values and anything else set by `ask`), in
/// the index's order, each read by `take`: a request a page, until `limit`
/// or the last page.
#[allow(clippy::too_many_arguments)] // one query's parts, each named once
pub(crate) async fn query_pages<T>(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    index: &str,
    condition: &str,
    op: idem_core::Operation,
    limit: usize,
    ask: impl FnOnce(
        aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
    mut take: impl FnMut(&crate::codec::Item) -> Result<T, idem_core::StoreError>,
) -> Result<Vec<T>, idem_core::StoreError> {
    // The query's own parts, built once; each page adds its start and size.
    let query = ask(client
        .query()
        .table_name(table)
        .index_name(index)
        .key_condition_expression(condition)
        .set_expression_attribute_names(Some(crate::journal_item::names(&[condition]))))
    .scan_index_forward(true);
    let mut found = Vec::new();
    let mut start: Option<crate::codec::Item> = None;
    loop {
        let page_limit = i32::try_from(limit.saturating_sub(found.len())).unwrap_or(i32::MAX);
        let page = query
            .clone()
            .limit(page_limit)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(|e| crate::error::classify(op, e))?;
        for item in page.items() {
            found.push(take(item)?);
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() || found.len() >= limit {
            found.truncate(limit);
            return Ok(found);
        }
    }
}
