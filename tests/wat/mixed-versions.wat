;; A component mixing contract versions: `describe` of 0.2.0 and `restapi-children` of 0.3.0 (which
;; a 0.2.0 plugin cannot have). The host refuses it rather than never calling the 0.3.0 interface.
(component
  (core module $m
    (func (export "describe") unreachable)
    (func (export "build") unreachable))
  (core instance $i (instantiate $m))
  (func $describe (canon lift (core func $i "describe")))
  (func $build (canon lift (core func $i "build")))
  (instance $plugin (export "describe" (func $describe)))
  (instance $restapi (export "build-restapi-children" (func $build)))
  (export "slinky:builder/plugin@0.2.0" (instance $plugin))
  (export "slinky:builder/restapi-children@0.3.0" (instance $restapi)))
