;; A component whose describe() has the contract's type but traps.
(component
  (component $inner
    (type $kind (enum "controller-service" "nodeset-pod"))
    (export $k "builder-kind" (type $kind))
    (type $info (record
      (field "name" string)
      (field "version" string)
      (field "kinds" (list $k))
      (field "contract-version" string)))
    (export $i "plugin-info" (type $info))
    (core module $m
      (memory (export "memory") 1)
      (func (export "describe") (result i32) unreachable))
    (core instance $ci (instantiate $m))
    (func $describe (result $i) (canon lift (core func $ci "describe") (memory (core memory $ci "memory"))))
    (export "describe" (func $describe)))
  (instance $plugin (instantiate $inner))
  (export "slinky:builder/plugin@0.1.0" (instance $plugin)))
