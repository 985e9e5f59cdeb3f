package admin_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every goroutine the admin API, its servers and the
// rules database start has ended once they are closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
