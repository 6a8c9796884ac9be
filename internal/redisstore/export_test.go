package redisstore

// Slot exposes slot to the tests, which compare it with CLUSTER KEYSLOT.
var Slot = slot
