package export

import "reflect"

// EmptyNotNull makes every nil slice and map reachable from v (a pointer) empty, so that
// the JSON view says [] and {} where nothing was found, as every other --json document
// does (docs/json-output.md: fields are always present with their empty value).
func EmptyNotNull(v any) { emptyNotNull(reflect.ValueOf(v)) }

func emptyNotNull(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			emptyNotNull(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				emptyNotNull(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.IsNil() && v.CanSet() {
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		}
		for i := range v.Len() {
			emptyNotNull(v.Index(i))
		}
	case reflect.Map:
		if v.IsNil() && v.CanSet() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		// Map values are not addressable; the maps of an observation hold strings.
	}
}
