-- The application's second migration.
ALTER TABLE refunds ADD COLUMN reason TEXT;
