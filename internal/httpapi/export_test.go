package httpapi

// RouteQueries maps each operation the server routes, as its method and path
// pattern ("GET /v1/charges/{id}"), to the query parameters it takes.
func RouteQueries() map[string][]string {
	m := map[string][]string{}
	add := func(prefix string, routes ...route) {
		for _, rt := range routes {
			m[rt.method+" "+prefix+rt.pattern] = rt.query
		}
	}
	add("/v1", v1Routes...)
	add("/v1", processorRoutes...)
	add("", openRoutes...)
	add("", docsRoute)
	return m
}
