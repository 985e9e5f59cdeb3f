package forwardauth_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if they leave goroutines behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
