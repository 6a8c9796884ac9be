package redisstore

// LeaseWaitingKey exposes the key of a pool's waiting mark to the tests.
func (s *Store) LeaseWaitingKey(pool string) string { return s.leaseWaitingKey(pool) }
