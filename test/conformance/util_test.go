package conformance

import "strconv"

func ptr[T any](v T) *T { return &v }

func itoa(i int) string { return strconv.Itoa(i) }
