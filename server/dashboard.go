package server

import (
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/ui"
)

// handlerMux is where the dashboard's routes go: the HTTP API
// (*httpapi.Handler) and the ops listener (*httpapi.Ops).
type handlerMux interface {
	Handle(pattern string, h http.Handler) error
}

// mountDashboard mounts /ui, GET /v1/top and GET /v1/keys/ on each of hs.
func (co *core) mountDashboard(hs ...handlerMux) error {
	d, err := ui.New(ui.Config{
		Rules:    co.rules.Current,
		Gatherer: co.reg,
		Mode:     co.mode,
		Observer: co.observer,
		Events:   co.events,
	})
	if err != nil {
		return err
	}
	keys := observe.KeysHandler(inspector(co.svc, co.stores))
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.Handle("/ui", d), h.Handle("/ui/", d),
			h.Handle("GET /v1/top", co.observer.TopHandler()), h.Handle("GET /v1/keys/", keys))
	}
	return errors.Join(errs...)
}
